"""A streamed response is a session's stream like a chat one, named by the response's id (issue
31): a client that reconnects (`GET /v1/responses/{id}?stream=true&starting_after=N`, or
`Last-Event-ID` on the session) loses and repeats nothing, and a replica SIGKILLed mid-response is
taken over by another that goes on with the same items and sequence numbers and keeps the
response as a whole, to be retrieved and continued there."""

from __future__ import annotations

import os
import signal
import time
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
from tests.surfaces.test_messages_sessions import assert_one_whole_message
from tests.surfaces.test_messages_sessions import read_then_drop as read_message_then_drop
from tests.surfaces.test_messages_sessions import whole_text as whole_message_text

BODY = {"model": "sim-model", "input": "a resumable answer", "max_output_tokens": 30, "stream": True}


def whole_text(gateway: Gateway) -> str:
    reply = httpx.post(f"{gateway.url}/v1/responses", json={**BODY, "stream": False}, headers=gateway.headers())
    return "".join(part["text"] for item in reply.json()["output"] for part in item["content"])


def read_then_drop(gateway: Gateway, keep: int, kill_pid: int | None = None) -> tuple[str, list[tuple[int, Any]]]:
    """(response id, the first `keep` events) of a new streamed response, read before dropping the
    connection (or SIGKILLing the replica)."""
    lines: list[str] = []
    with httpx.stream("POST", f"{gateway.url}/v1/responses", json=BODY, headers=gateway.headers(), timeout=20) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            lines.append(line)
            if len(parse(lines)) == keep:
                if kill_pid is not None:
                    os.kill(kill_pid, signal.SIGKILL)
                break
    events = parse(lines)
    return events[0][1]["response"]["id"], events


def read_again(gateway: Gateway, response_id: str, starting_after: int) -> list[tuple[int, Any]]:
    """The response's events after sequence number `starting_after`, as the SDK's
    `responses.retrieve(id, stream=True, starting_after=N)` asks for them."""
    url = f"{gateway.url}/v1/responses/{response_id}?stream=true&starting_after={starting_after}"
    reply = httpx.get(url, headers=gateway.headers(), timeout=30)
    assert reply.status_code == 200, reply.text
    return parse(reply.text.splitlines())


def poll_until_ended(gateway: Gateway, response_id: str, within_s: float = 60.0) -> dict[str, Any]:
    """`GET /v1/responses/{id}` until the response is no longer in progress (bounded)."""
    deadline = time.monotonic() + within_s
    while True:
        reply = httpx.get(f"{gateway.url}/v1/responses/{response_id}", headers=gateway.headers(), timeout=10)
        assert reply.status_code == 200, reply.text
        if reply.json()["status"] not in ("queued", "in_progress"):
            return dict(reply.json())
        assert time.monotonic() < deadline, f"still {reply.json()['status']} after {within_s} s"
        time.sleep(0.1)


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
        response_id, seen = read_then_drop(gateway, keep)
        rest = read_again(gateway, response_id, seen[-1][1]["sequence_number"])
        assert_one_whole_response(seen + rest, whole_text(gateway))
        # The same stream is the response's session: Last-Event-ID on it resumes it too.
        assert resume(gateway, response_id, seen[-1][0]) == rest


def test_a_cancelled_background_response_stops_and_is_kept_as_cancelled(slow_sim: Announced, tmp_path: Path) -> None:
    with running_gateway(tmp_path, gateway_config(deployment("a", slow_sim))) as gateway:
        body = {**BODY, "stream": False, "background": True, "max_output_tokens": 2000}
        begun = httpx.post(f"{gateway.url}/v1/responses", json=body, headers=gateway.headers(), timeout=20).json()
        url = f"{gateway.url}/v1/responses/{begun['id']}"
        with httpx.stream("GET", f"{url}?stream=true", headers=gateway.headers(), timeout=30) as reply:
            lines: list[str] = []
            for line in reply.iter_lines():
                lines.append(line)
                if len(parse(lines)) == 6:  # it is under way
                    cancelled = httpx.post(f"{url}/cancel", headers=gateway.headers(), timeout=20)
            events = parse(lines)
        retrieved = httpx.get(url, headers=gateway.headers(), timeout=10).json()
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert events[-1][1]["type"] == "response.failed"
    assert events[-1][1]["response"]["status"] == "cancelled"
    assert retrieved == events[-1][1]["response"]
    deltas = sum(1 for _, p in events if p["type"] == "response.output_text.delta")
    assert deltas < 2000  # stopped long before the end


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
                response_id, seen = read_then_drop(first, keep, kill_pid=first.process.process.pid)
                first.process.process.wait(10)
                rest = read_again(second, response_id, seen[-1][1]["sequence_number"])
                assert_one_whole_response(seen + rest, whole_text(second))
                # The replica that finished it kept it: retrieved whole, and continued.
                kept = httpx.get(f"{second.url}/v1/responses/{response_id}", headers=second.headers(), timeout=10)
                assert kept.json() == rest[-1][1]["response"]
                following = {"model": "sim-model", "input": "go on", "previous_response_id": response_id}
                reply = httpx.post(f"{second.url}/v1/responses", json=following, headers=second.headers(), timeout=20)
                assert reply.status_code == 200, reply.text
            # A background response whose replica dies while a client follows it on another.
            first = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
            first.key = second.key
            body = {**BODY, "stream": False, "background": True}
            begun = httpx.post(f"{first.url}/v1/responses", json=body, headers=first.headers(), timeout=20).json()
            lines: list[str] = []
            url = f"{second.url}/v1/responses/{begun['id']}?stream=true"
            with httpx.stream("GET", url, headers=second.headers(), timeout=30) as reply:
                for line in reply.iter_lines():
                    lines.append(line)
                    if len(parse(lines)) == 4 and first.process.process.poll() is None:
                        os.kill(first.process.process.pid, signal.SIGKILL)
            assert_one_whole_response(parse(lines), whole_text(second))
            # One only polled: the replica asked about it takes it over once the dead one's lease lapses.
            first = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
            first.key = second.key
            begun = httpx.post(f"{first.url}/v1/responses", json=body, headers=first.headers(), timeout=20).json()
            os.kill(first.process.process.pid, signal.SIGKILL)
            polled = poll_until_ended(second, begun["id"])
            (item,) = polled["output"]
            assert (polled["status"], item["content"][0]["text"]) == ("incomplete", whole_text(second))
            # Taken over before any event was checkpointed, it still repeats its request.
            assert (polled["max_output_tokens"], polled["background"]) == (30, True)
            # An Anthropic Messages stream on the same pair: the taking writer goes on with its blocks.
            first = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
            first.key = second.key
            session_id = f"m-{uuid.uuid4().hex[:8]}"
            seen = read_message_then_drop(first, session_id, 7, kill_pid=first.process.process.pid)
            first.process.process.wait(10)
            assert_one_whole_message(seen + resume(second, session_id, seen[-1][0]), whole_message_text(second))
    finally:
        delete_redis_prefix(prefix)
