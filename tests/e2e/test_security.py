"""Keys and scopes over HTTP: 401 for bad keys, 403 for missing scopes, 404 across tenants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from gateway.auth.stage import new_secret
from testkit.procs import Gateway, deployment, gateway_config, running_gateway

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("security")
    config = gateway_config(deployment("a", sim_pair[0]))
    # A second model, so that a key can be limited to a model other than the one it asks for.
    config["models"].append({"name": "other-model", "deployments": [deployment("b", sim_pair[0])]})
    with running_gateway(path, config) as running:
        yield running


def chat(gateway: Gateway, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=headers, timeout=10)


def admin(gateway: Gateway, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{gateway.url}/admin", headers=gateway.headers(key), timeout=10)


@pytest.mark.parametrize(
    ("case", "headers"),
    [
        ("missing", {}),
        ("not bearer", {"Authorization": "Basic abc"}),
        ("malformed", {"Authorization": "Bearer sk-not-ours"}),
        ("unknown", {"Authorization": f"Bearer {new_secret()}"}),
    ],
)
def test_bad_keys_are_401(gateway: Gateway, case: str, headers: dict[str, str]) -> None:
    reply = chat(gateway, headers)
    assert reply.status_code == 401, case
    assert reply.json()["error"]["type"] == "authentication_error"


def test_revoked_key_is_401_at_once(gateway: Gateway) -> None:
    key_id, secret = gateway.create_key()
    assert chat(gateway, gateway.headers(secret)).status_code == 200
    with admin(gateway, gateway.admin_key) as client:
        client.post(f"/keys/{key_id}/revoke", json={"reason": "leaked"}).raise_for_status()
    reply = chat(gateway, gateway.headers(secret))
    assert reply.status_code == 401
    assert "revoked" in reply.json()["error"]["message"]


def test_expired_key_is_401(gateway: Gateway) -> None:
    _, secret = gateway.create_key(expires_in_s=0.001)
    assert chat(gateway, gateway.headers(secret)).status_code == 401


def test_rotated_key_old_secret_stops_working(gateway: Gateway) -> None:
    key_id, old = gateway.create_key()
    with admin(gateway, gateway.admin_key) as client:
        new = client.post(f"/keys/{key_id}/rotate").json()["secret"]
    assert chat(gateway, gateway.headers(old)).status_code == 401
    assert chat(gateway, gateway.headers(new)).status_code == 200


def test_key_without_chat_scope_cannot_chat(gateway: Gateway) -> None:
    _, secret = gateway.create_key(scopes=["audit"])
    assert chat(gateway, gateway.headers(secret)).status_code == 403


def test_chat_key_cannot_use_the_admin_api(gateway: Gateway) -> None:
    with admin(gateway, gateway.key) as client:
        assert client.get("/keys").status_code == 403
        assert client.post("/keys", json={"name": "x", "tenant": "acme"}).status_code == 403
        assert client.get("/audit").status_code == 403


def test_model_outside_the_keys_list_is_404(gateway: Gateway) -> None:
    _, secret = gateway.create_key(models=["other-model"])
    reply = chat(gateway, gateway.headers(secret))
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"
    models = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers(secret), timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["other-model"]


def test_other_tenants_keys_are_404_on_every_id_endpoint(gateway: Gateway) -> None:
    foreign_id, _ = gateway.create_key(tenant="globex")
    _, acme_admin = gateway.create_key(scopes=["admin", "audit"])
    with admin(gateway, acme_admin) as client:
        assert client.get(f"/keys/{foreign_id}").status_code == 404
        assert client.post(f"/keys/{foreign_id}/revoke").status_code == 404
        assert client.post(f"/keys/{foreign_id}/rotate").status_code == 404
        assert client.post("/keys", json={"name": "x", "tenant": "globex"}).status_code == 404
        listed = {k["tenant"] for k in client.get("/keys").json()["data"]}
        audit = {r["tenant"] for r in client.get("/audit", params={"limit": 1000}).json()["data"]}
    assert listed == {"acme"}
    assert audit <= {"acme"}


def test_secrets_are_never_returned_after_creation(gateway: Gateway) -> None:
    key_id, secret = gateway.create_key()
    with admin(gateway, gateway.admin_key) as client:
        shown = client.get(f"/keys/{key_id}").text
        listed = client.get("/keys").text
    assert secret not in shown
    assert secret not in listed
    assert "digest" not in shown
