"""High 4: requests without a valid key cannot grow the audit log, and `X-Request-Id` is capped."""

from __future__ import annotations

import time

import httpx

from tests.procs import Gateway
from tests.security.helpers import CHAT, REFUSAL_INTERVAL_S, admin_get, audit_count, chat

FLOOD = 60


def _unauthenticated(gateway: Gateway, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=headers, timeout=15)


def _sync_audit(gateway: Gateway) -> str:
    """An answered request whose record, once visible, proves every earlier record is written."""
    reply = chat(gateway)
    assert reply.status_code == 200
    request_id = reply.headers["x-request-id"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        records = admin_get(gateway, "/audit", kind="request", limit=10_000)["data"]
        if any(r["request_id"] == request_id for r in records):
            return request_id
        time.sleep(0.05)
    raise AssertionError("the audit record of an answered request never appeared")


def test_high4_unauthenticated_flood_adds_a_bounded_number_of_records(gateway: Gateway) -> None:
    _sync_audit(gateway)
    before, started = audit_count(gateway), time.monotonic()
    for i in range(FLOOD):
        headers = {"Authorization": f"Bearer agw_{'x' * 43}"} if i % 2 else {}
        headers["X-Request-Id"] = "r" * 100_000 if i % 3 == 0 else f"flood-{i}"
        assert _unauthenticated(gateway, headers).status_code == 401
    _sync_audit(gateway)
    intervals = (time.monotonic() - started) / REFUSAL_INTERVAL_S
    # The answered request, plus at most one aggregate per interval that began: never one
    # record per refusal.
    grown = audit_count(gateway) - before
    assert grown <= 2 + intervals, (grown, intervals)
    assert intervals < FLOOD / 2  # else the bound above would not tell the difference


def test_high4_refusals_are_counted_per_source_and_reason(gateway: Gateway) -> None:
    for _ in range(5):
        assert _unauthenticated(gateway, {"Authorization": "Basic nope"}).status_code == 401
    deadline = time.monotonic() + 20
    counted = 0
    while time.monotonic() < deadline and counted < 5:
        records = admin_get(gateway, "/audit", kind="auth_refusals", limit=10_000)["data"]
        counted = sum(
            c["count"]
            for r in records
            for c in r["counts"]
            if c["source"] == "127.0.0.1" and c["reason"] == "invalid_api_key"
        )
        time.sleep(0.05)
    assert counted >= 5


def test_high4_oversized_request_id_is_replaced(gateway: Gateway) -> None:
    reply = chat(gateway, headers={"X-Request-Id": "a" * 4096})
    assert reply.status_code == 200
    assert reply.headers["x-request-id"] != "a" * 4096
    assert 1 <= len(reply.headers["x-request-id"]) <= 128


def test_high4_request_id_with_odd_characters_is_replaced(gateway: Gateway) -> None:
    reply = chat(gateway, headers={"X-Request-Id": "abc def<script>"})
    assert reply.status_code == 200
    assert reply.headers["x-request-id"] != "abc def<script>"


def test_high4_valid_request_id_is_kept(gateway: Gateway) -> None:
    reply = chat(gateway, headers={"X-Request-Id": "trace-42:abc_DEF.1"})
    assert reply.headers["x-request-id"] == "trace-42:abc_DEF.1"
