"""A streamed response is a session's stream like a chat one (issue 31): a client that reconnects
with `Last-Event-ID` loses and repeats nothing, and a replica SIGKILLed mid-response is taken over
by another that goes on with the same items and sequence numbers."""

from __future__ import annotations

import os
import signal
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from gateway.auth.stage import new_secret
from testkit.procs import (
    Gateway,
    delete_redis_prefix,
    deployment,
    gateway_config,
    gateway_process,
    redis_store_config,
    running_gateway,
)
from tests.e2e.test_sessions import parse, resume

BODY = {"model": "sim-model", "input": "a resumable answer", "max_output_tokens": 30, "stream": True}


def whole_text(gateway: Gateway) -> str:
    reply = httpx.post(f"{gateway.url}/v1/responses", json={**BODY, "stream": False}, headers=gateway.headers())
    return "".join(part["text"] for item in reply.json()["output"] for part in item["content"])


def read_then_drop(gateway: Gateway, session_id: str, keep: int, kill_pid: int | None = None) -> list[tuple[int, Any]]:
    """Read `keep` events of a new streamed response, then drop the connection (or SIGKILL the replica)."""
    lines: list[str] = []
    headers = {**gateway.headers(), "X-Session-Id": session_id}
    with httpx.stream("POST", f"{gateway.url}/v1/responses", json=BODY, headers=headers, timeout=20) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            lines.append(line)
            if len(parse(lines)) == keep:
                if kill_pid is not None:
                    os.kill(kill_pid, signal.SIGKILL)
                break
    return parse(lines)


def assert_one_whole_response(events: list[tuple[int, Any]], text: str) -> None:
    ids = [seq for seq, _ in events]
    assert ids == list(range(1, len(ids) + 1)), "every event id once, in order"
    payloads = [payload for _, payload in events]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert payloads[-1]["type"] == "response.incomplete"  # the 30 tokens ran out
    assert len({p["response"]["id"] for p in payloads if "response" in p}) == 1
    deltas = "".join(p["delta"] for p in payloads if p["type"] == "response.output_text.delta")
    assert deltas == text
    (item,) = payloads[-1]["response"]["output"]
    assert item["content"][0]["text"] == text


@pytest.mark.parametrize("keep", [1, 3, 12])
def test_a_response_stream_resumed_after_a_disconnect_loses_and_repeats_nothing(
    slow_sim: Announced, tmp_path: Path, keep: int
) -> None:
    with running_gateway(tmp_path, gateway_config(deployment("a", slow_sim))) as gateway:
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        seen = read_then_drop(gateway, session_id, keep)
        rest = resume(gateway, session_id, seen[-1][0])
        assert_one_whole_response(seen + rest, whole_text(gateway))


def test_a_replica_sigkilled_mid_response_is_taken_over_by_another(tmp_path: Path, slow_sim: Announced) -> None:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(
        deployment("a", slow_sim),
        store=redis_store_config(prefix),
        sessions={"lease_ttl_s": 1.0, "checkpoint_interval_s": 0.05, "checkpoint_every_events": 4},
    )
    admin_key = new_secret()
    try:
        with ExitStack() as stack:
            second = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            for keep in (3, 12):
                first = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
                first.key = second.key
                session_id = f"s-{uuid.uuid4().hex[:8]}"
                seen = read_then_drop(first, session_id, keep, kill_pid=first.process.process.pid)
                first.process.process.wait(10)
                rest = resume(second, session_id, seen[-1][0])
                assert_one_whole_response(seen + rest, whole_text(second))
    finally:
        delete_redis_prefix(prefix)
