"""Issue 11, Low: client-triggerable 500s on the admin side. `?status=bogus` on the approvals list,
`rpm: 2**70` on a new key and a huge `after_seq` on the audit query must each be a 4xx in OpenAI's
error shape, and the gateway must go on answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("admin-bad-input")
    with running_gateway(path, gateway_config(deployment("a", sim_pair[0]))) as running:
        yield running


def assert_openai_4xx(reply: httpx.Response) -> None:
    assert 400 <= reply.status_code < 500, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}


def admin_get(gateway: Gateway, path: str, params: dict[str, Any]) -> httpx.Response:
    return httpx.get(f"{gateway.url}{path}", params=params, headers=gateway.headers(gateway.admin_key), timeout=10)


@pytest.mark.parametrize("status", ["bogus", "PENDING", "", "x" * 5000], ids=["bogus", "upper", "empty", "long"])
def test_approvals_list_with_unknown_status_is_400(gateway: Gateway, status: str) -> None:
    reply = admin_get(gateway, "/admin/approvals", {"status": status})
    assert_openai_4xx(reply)
    assert reply.json()["error"]["param"] == "status"


@pytest.mark.parametrize("field", ["rpm", "tpm", "max_concurrency", "daily_tokens"])
def test_key_limit_beyond_2_pow_53_is_400(gateway: Gateway, field: str) -> None:
    body = {"name": "huge", "tenant": "acme", field: 2**70}
    reply = httpx.post(f"{gateway.url}/admin/keys", json=body, headers=gateway.headers(gateway.admin_key), timeout=10)
    assert_openai_4xx(reply)
    assert reply.json()["error"]["param"] == field


def test_key_with_endless_expiry_is_400(gateway: Gateway) -> None:
    body = {"name": "forever", "tenant": "acme", "expires_in_s": 1e300}
    reply = httpx.post(f"{gateway.url}/admin/keys", json=body, headers=gateway.headers(gateway.admin_key), timeout=10)
    assert_openai_4xx(reply)


@pytest.mark.parametrize("after_seq", [2**70, 2**63, -(2**70), -5])
def test_audit_query_with_out_of_range_after_seq_is_400(gateway: Gateway, after_seq: int) -> None:
    reply = admin_get(gateway, "/admin/audit", {"after_seq": after_seq})
    assert_openai_4xx(reply)
    assert reply.json()["error"]["param"] == "after_seq"


def test_gateway_still_answers_after_the_bad_input(gateway: Gateway) -> None:
    assert admin_get(gateway, "/admin/audit", {"after_seq": 0, "limit": 1}).status_code == 200
    assert admin_get(gateway, "/admin/approvals", {"status": "pending"}).status_code == 200
