"""Issue 11, High 2: a tenant-scoped admin key controlled every tenant's models.

The tenancy model under test (README "Security model"): a model lists the tenants that may use it
(none listed: every tenant); only a platform admin (the bootstrap key, or a key with the
`platform` scope) or the admin of a model's only tenant manages its releases; a key never mints
or rotates a key wider than itself.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, running_gateway

SHARED = "sim-model"  # no tenants listed: every tenant uses it, only a platform admin manages it
ACME_ONLY = "acme-model"  # tenants: [acme]: acme's admins manage it, nobody else sees it
QUESTION = [{"role": "user", "content": "who configured you?"}]


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("tenancy")
    config = {
        "routing": {"health": {"interval_s": 30}},
        "models": [
            {"name": SHARED, "deployments": [deployment("a", sim_pair[0])]},
            {"name": ACME_ONLY, "tenants": ["acme"], "deployments": [deployment("acme-a", sim_pair[0])]},
        ],
    }
    with running_gateway(path, config) as running:
        yield running


def post(gateway: Gateway, key: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body or {}, headers=gateway.headers(key), timeout=30)


def answer(gateway: Gateway, key: str, model: str = SHARED) -> httpx.Response:
    body = {"model": model, "messages": QUESTION, "max_tokens": 6}
    return post(gateway, key, "/v1/chat/completions", body)


def test_tenant_admin_cannot_create_or_promote_a_release_other_tenants_get(gateway: Gateway) -> None:
    _, acme_admin = gateway.create_key(tenant="acme", scopes=["admin", "chat"])
    _, globex = gateway.create_key(tenant="globex")
    before = answer(gateway, globex)
    assert before.status_code == 200

    created = post(gateway, acme_admin, f"/admin/models/{SHARED}/releases", {"version": "evil", "system_prompt": "X"})
    assert created.status_code == 403, created.text
    assert created.json()["error"]["type"] == "permission_error"
    # A release made by the platform admin cannot be promoted, canaried or rolled back by acme either.
    assert post(gateway, gateway.admin_key, f"/admin/models/{SHARED}/releases", {"version": "v1"}).status_code == 201
    for path, body in [
        ("promote", {"version": "v1"}),
        ("rollback", {"version": "v1"}),
        ("canary", {"version": "v1"}),
    ]:
        reply = post(gateway, acme_admin, f"/admin/models/{SHARED}/{path}", body)
        assert reply.status_code == 403, (path, reply.text)
    deleted = httpx.delete(
        f"{gateway.url}/admin/models/{SHARED}/canary", headers=gateway.headers(acme_admin), timeout=10
    )
    assert deleted.status_code == 403
    overview = httpx.get(f"{gateway.url}/admin/models/{SHARED}/releases", headers=gateway.headers(acme_admin))
    assert overview.json()["active"] is None
    assert answer(gateway, globex).json()["choices"][0]["message"] == before.json()["choices"][0]["message"]


def test_owner_tenant_admin_manages_its_own_model(gateway: Gateway) -> None:
    _, acme_admin = gateway.create_key(tenant="acme", scopes=["admin", "chat"])
    created = post(gateway, acme_admin, f"/admin/models/{ACME_ONLY}/releases", {"version": "mine"})
    assert created.status_code == 201, created.text
    promoted = post(gateway, acme_admin, f"/admin/models/{ACME_ONLY}/promote", {"version": "mine"})
    assert promoted.status_code == 200, promoted.text


def test_model_of_another_tenant_is_invisible(gateway: Gateway) -> None:
    _, globex = gateway.create_key(tenant="globex")
    _, globex_admin = gateway.create_key(tenant="globex", scopes=["admin"])
    assert answer(gateway, globex, ACME_ONLY).status_code == 404
    models = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers(globex), timeout=10).json()
    assert [m["id"] for m in models["data"]] == [SHARED]
    reply = post(gateway, globex_admin, f"/admin/models/{ACME_ONLY}/releases", {"version": "x"})
    assert reply.status_code == 404
    overview = httpx.get(f"{gateway.url}/admin/models/{ACME_ONLY}/releases", headers=gateway.headers(globex_admin))
    assert overview.status_code == 404
    assert answer(gateway, gateway.key, ACME_ONLY).status_code == 200  # an acme chat key


def test_platform_key_manages_shared_models(gateway: Gateway) -> None:
    _, platform = gateway.create_key(tenant="ops", scopes=["admin", "platform"])
    gateway.create_key(tenant="globex")  # so two tenants besides its own hold keys, whatever ran before
    created = post(gateway, platform, f"/admin/models/{SHARED}/releases", {"version": "platform-1"})
    assert created.status_code == 201, created.text
    listed = httpx.get(f"{gateway.url}/admin/keys", headers=gateway.headers(platform), timeout=10).json()["data"]
    assert {k["tenant"] for k in listed} >= {"acme", "globex"}


def test_tenant_admin_cannot_mint_a_key_wider_than_itself(gateway: Gateway) -> None:
    _, narrow = gateway.create_key(tenant="acme", scopes=["admin", "chat"], models=[SHARED], rpm=2)
    wider: list[dict[str, Any]] = [
        {"name": "other model", "tenant": "acme", "models": [ACME_ONLY]},
        {"name": "more rpm", "tenant": "acme", "models": [SHARED], "rpm": 3},
        {"name": "more scopes", "tenant": "acme", "models": [SHARED], "scopes": ["audit"]},
        {"name": "platform", "tenant": "acme", "models": [SHARED], "scopes": ["platform"]},
        {"name": "other tenant", "tenant": "globex", "models": [SHARED]},
    ]
    for body in wider:
        reply = post(gateway, narrow, "/admin/keys", body)
        assert reply.status_code in (403, 404), (body["name"], reply.text)
        assert reply.json()["error"]["type"] in ("permission_error", "not_found_error")
    # Within its bounds it may create keys; models and limits it leaves open are inherited, never dropped.
    made = post(gateway, narrow, "/admin/keys", {"name": "ok", "tenant": "acme"})
    assert made.status_code == 201, made.text
    assert made.json()["key"]["limits"]["rpm"] == 2
    assert made.json()["key"]["models"] == [SHARED]
    smaller = post(gateway, narrow, "/admin/keys", {"name": "ok", "tenant": "acme", "models": [SHARED], "rpm": 1})
    assert smaller.status_code == 201


def test_tenant_admin_cannot_rotate_or_revoke_a_wider_key_of_its_tenant(gateway: Gateway) -> None:
    platform_id, _ = gateway.create_key(tenant="acme", scopes=["admin", "platform"])
    _, acme_admin = gateway.create_key(tenant="acme", scopes=["admin"])
    assert post(gateway, acme_admin, f"/admin/keys/{platform_id}/rotate").status_code == 403
    assert post(gateway, acme_admin, f"/admin/keys/{platform_id}/revoke").status_code == 403


def test_only_a_platform_admin_reloads_the_policy_file(gateway: Gateway) -> None:
    _, acme_admin = gateway.create_key(tenant="acme", scopes=["admin"])
    _, platform = gateway.create_key(tenant="ops", scopes=["admin", "platform"])
    assert post(gateway, acme_admin, "/admin/policies/reload").status_code == 403
    assert post(gateway, platform, "/admin/policies/reload").status_code == 200


def test_a_key_naming_a_model_its_tenant_cannot_use_is_refused_at_creation(gateway: Gateway) -> None:
    """Issue 29 item 6: such a key was stored, and got 404 for the model it was made for."""
    _, globex_admin = gateway.create_key(tenant="globex", scopes=["admin", "chat"])
    asked = [
        (globex_admin, "globex", ACME_ONLY),  # a tenant admin naming another tenant's model
        (globex_admin, "globex", "no-such-model"),  # or one that does not exist: told apart by nobody
        (gateway.admin_key, "globex", ACME_ONLY),  # a platform admin too: the key would be useless
    ]
    messages = []
    for actor, tenant, model in asked:
        reply = post(gateway, actor, "/admin/keys", {"name": "useless", "tenant": tenant, "models": [SHARED, model]})
        assert reply.status_code == 400, (model, reply.text)
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("model_not_found", "models"), error
        assert f"'{model}'" in error["message"], error
        messages.append(error["message"].replace(model, "<model>"))
    assert messages[0] == messages[1], "a tenant admin could tell another tenant's model from no model"
    listed = httpx.get(f"{gateway.url}/admin/keys", headers=gateway.headers(gateway.admin_key), timeout=10)
    assert not [k for k in listed.json()["data"] if k["name"] == "useless"], "a refused key was stored"
    # What the tenant may use is still granted.
    _, acme_admin = gateway.create_key(tenant="acme", scopes=["admin", "chat"])
    mine = post(gateway, acme_admin, "/admin/keys", {"name": "mine", "tenant": "acme", "models": [ACME_ONLY, SHARED]})
    assert mine.status_code == 201, mine.text
    assert answer(gateway, mine.json()["secret"], ACME_ONLY).status_code == 200
    shared = post(gateway, globex_admin, "/admin/keys", {"name": "shared", "tenant": "globex", "models": [SHARED]})
    assert shared.status_code == 201, shared.text


def test_the_cli_refuses_a_key_naming_a_model_its_tenant_cannot_use(gateway: Gateway) -> None:
    command = ["gateway", "keys", "create", "--config", str(gateway.config_path), "--name", "cli"]
    refused = subprocess.run(
        [*command, "--tenant", "globex", "--models", ACME_ONLY], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"'{ACME_ONLY}'" in refused.stderr
    assert "secret" not in refused.stdout
    made = subprocess.run(
        [*command, "--tenant", "acme", "--models", ACME_ONLY], capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stdout + made.stderr
