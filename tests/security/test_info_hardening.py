"""Issue 11, Info: `/openapi.json` was public (it now needs an admin key, or is switched off with
`server.openapi: off`); admin pages sent no CSP, `X-Frame-Options` or `Referrer-Policy`."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("info-hardening")
    with running_gateway(path, gateway_config(deployment("a", sim_pair[0]))) as running:
        yield running


def get(gateway: Gateway, path: str, key: str | None = None) -> httpx.Response:
    headers = gateway.headers(key) if key else {}
    return httpx.get(f"{gateway.url}{path}", headers=headers, timeout=10)


def test_openapi_schema_needs_an_admin_key(gateway: Gateway) -> None:
    assert get(gateway, "/openapi.json").status_code == 401
    assert get(gateway, "/openapi.json", gateway.key).status_code == 403
    reply = get(gateway, "/openapi.json", gateway.admin_key)
    assert reply.status_code == 200
    assert "/admin/keys" in reply.json()["paths"]
    for docs in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert get(gateway, docs, gateway.admin_key).status_code == 404


def test_openapi_schema_can_be_switched_off(sim_pair: list[Announced], tmp_path: Path) -> None:
    config = gateway_config(deployment("a", sim_pair[0]), server={"openapi": "off"})
    with running_gateway(tmp_path, config) as gateway:
        assert get(gateway, "/openapi.json", gateway.admin_key).status_code == 404


@pytest.mark.parametrize("page", ["approvals", "releases", "admin.js"])
def test_admin_pages_send_security_headers(gateway: Gateway, page: str) -> None:
    reply = get(gateway, f"/admin/ui/{page}")
    assert reply.status_code == 200
    assert reply.headers["X-Frame-Options"] == "DENY"
    assert reply.headers["Referrer-Policy"] == "no-referrer"
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    csp = reply.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert "default-src 'none'" in csp
    # Every inline block the page has is allowed by its hash, and nothing else inline is.
    for kind, body in re.findall(r"<(script|style)>(.*?)</\1>", reply.text, re.S):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp, kind
