"""Requests and checks the security tests share."""

from __future__ import annotations

from typing import Any

import httpx

from testkit.procs import Gateway

REFUSAL_INTERVAL_S = 1.0  # the security gateways count refusals per second

CHAT: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# get_weather is allowed; delete_repo is not in the policy at all (denied by default).
SECURITY_POLICY = """
policies:
  agent:
    tools:
      - {name: get_weather, risk: low}
bindings:
  tenants: {acme: agent}
"""


def nested(depth: int) -> Any:
    """A JSON value `depth` levels deep (lists in lists)."""
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def chat(
    gateway: Gateway, body: Any = None, *, key: str | None = None, timeout: float = 15, **kw: Any
) -> httpx.Response:
    headers = {**gateway.headers(key), **kw.pop("headers", {})}
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=CHAT if body is None else body,
        headers=headers,
        timeout=timeout,
        **kw,
    )


def admin_get(gateway: Gateway, path: str, **params: Any) -> Any:
    reply = httpx.get(
        f"{gateway.url}/admin{path}", params=params, headers=gateway.headers(gateway.admin_key), timeout=30
    )
    reply.raise_for_status()
    return reply.json()


def audit_count(gateway: Gateway) -> int:
    """How many records the chain holds (every kind)."""
    return int(admin_get(gateway, "/audit/verify")["checked"])


def assert_openai_error(reply: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code, error
    return dict(error)
