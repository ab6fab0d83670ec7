"""High 4: requests without a valid key cannot grow the audit log, and `X-Request-Id` is capped."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from common.processes import Announced
from testkit.procs import Gateway, GatewayProcess, deployment, gateway_config, gateway_process
from tests.security.helpers import CHAT, admin_get, audit_count, chat

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


@pytest.fixture
def hourly(sim_pair: list[Announced], tmp_path: Path) -> Iterator[GatewayProcess]:
    """A gateway that writes its refusal counts once an hour (and when it stops)."""
    config = gateway_config(deployment("a", sim_pair[0]), audit={"refusal_interval_s": 3600})
    with gateway_process(tmp_path, config) as running:
        yield running


def test_high4_unauthenticated_flood_adds_a_bounded_number_of_records(hourly: GatewayProcess) -> None:
    _sync_audit(hourly)
    before = audit_count(hourly)
    for i in range(FLOOD):
        headers = {"Authorization": f"Bearer agw_{'x' * 43}"} if i % 2 else {}
        # Far past X-Request-Id's 128 characters, within server.max_header_bytes (past that: 431).
        headers["X-Request-Id"] = "r" * 10_000 if i % 3 == 0 else f"flood-{i}"
        assert _unauthenticated(hourly, headers).status_code == 401
    _sync_audit(hourly)
    assert audit_count(hourly) - before == 1  # the answered request's record; none per refusal
    hourly.process.stop()  # a graceful stop writes the interval's counts
    exported = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "export", "--config", str(hourly.config_path)],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    tallies = [r for r in map(orjson.loads, exported.splitlines()) if r["kind"] == "auth_refusals"]
    assert len(tallies) == 1
    assert sum(c["count"] for c in tallies[0]["counts"]) == FLOOD
    assert all(len(r.get("request_id") or "") <= 128 for r in map(orjson.loads, exported.splitlines()))


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
