"""Replica loss and reconnects across replicas: exactly one generation per session, and the
request's audit record and usage are whole whichever replica finishes it."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import (
    GatewayProcess,
    deployment,
    gateway_config,
    gateway_process,
    served_count,
    start_redis,
    start_sim,
)
from tests.chaos.replicas import Replicas, parse, replicas_on_redis, resume, text_of, usage_of

pytestmark = pytest.mark.chaos

MAX_TOKENS = 60
RPM = 1000
BODY = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "an answer worth resuming"}],
    "max_tokens": MAX_TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture(scope="module")
def sim() -> Iterator[Announced]:
    process = start_sim("--tpot-ms", "20")
    try:
        yield process
    finally:
        process.stop()


def expected(sim: Announced) -> tuple[str, dict[str, Any]]:
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json={**BODY, "stream": False}, timeout=10).json()
    return str(reply["choices"][0]["message"]["content"]), reply["usage"]


def read_then_drop(
    gateway: GatewayProcess, session_id: str, request_id: str, keep: int
) -> list[tuple[int | None, Any]]:
    """Read `keep` events of a new stream, then drop the connection (the replica goes on)."""
    lines: list[str] = []
    headers = {**gateway.headers(), "X-Session-Id": session_id, "X-Request-Id": request_id}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            lines.append(line)
            if len(parse(lines)) == keep:
                break
    return parse(lines)


def wait_for_records(group: Replicas, request_ids: set[str], deadline_s: float = 20.0) -> list[dict[str, Any]]:
    """The request records of `request_ids`, once each has one."""
    everything = group.audit_when(lambda found: request_ids <= {r["request_id"] for r in found}, deadline_s=deadline_s)
    return [r for r in everything if r["request_id"] in request_ids]


def assert_nothing_lost(group: Replicas, request_ids: set[str], text: str, usage: dict[str, Any]) -> None:
    records = wait_for_records(group, request_ids)
    assert sorted(r["request_id"] for r in records) == sorted(request_ids)  # one each, none missing
    for record in records:
        assert record["status"] == 200, record
        assert record["completion_tokens"] >= usage["completion_tokens"], record
    assert group.verify()["ok"]


@pytest.mark.parametrize("keep", [1, 2, 5])
def test_reconnecting_to_another_replica_while_the_owner_lives_never_generates_twice(
    tmp_path: Path, sim: Announced, keep: int
) -> None:
    text, usage = expected(sim)
    config = gateway_config(deployment("a", sim))
    with replicas_on_redis(tmp_path, config) as group:
        group.use_key(rpm=RPM, max_concurrency=3)
        owner, other = group.live
        before = served_count(sim)
        request_ids = set()
        for _ in range(3):
            session_id, request_id = f"s-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
            request_ids.add(request_id)
            seen = read_then_drop(owner, session_id, request_id, keep)
            rest = resume(other, session_id, int(seen[-1][0] or 0))
            assert [s for s, _ in seen + rest] == list(range(1, len(seen) + len(rest) + 1))
            assert text_of(seen + rest) == text
        assert served_count(sim) - before == 3  # one generation per session
        assert_nothing_lost(group, request_ids, text, usage)
        assert group.remaining_requests() == RPM - 3 - 1


def test_a_new_answer_for_a_session_streaming_on_another_replica_is_409(tmp_path: Path, sim: Announced) -> None:
    config = gateway_config(deployment("a", sim))
    with replicas_on_redis(tmp_path, config) as group:
        owner, other = group.live
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        headers = {**owner.headers(), "X-Session-Id": session_id}
        url = "/v1/chat/completions"
        with httpx.stream("POST", f"{owner.url}{url}", json=BODY, headers=headers, timeout=30) as first:
            assert first.status_code == 200
            busy = httpx.post(f"{other.url}{url}", json=BODY, headers=headers, timeout=30)
            assert busy.status_code == 409, busy.text
            assert busy.json()["error"]["param"] == "X-Session-Id"
            assert text_of(parse(list(first.iter_lines())))
        # Once the owner is done, any replica may start the session's next answer at once.
        after = httpx.post(f"{other.url}{url}", json=BODY, headers=headers, timeout=30)
        assert after.status_code == 200, after.text


def kill_after(group: Replicas, gateway: GatewayProcess, session_id: str, request_id: str, keep: int) -> list[Any]:
    """Read `keep` events of a new stream, then SIGKILL the replica that serves it."""
    lines: list[str] = []
    headers = {**gateway.headers(), "X-Session-Id": session_id, "X-Request-Id": request_id}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            lines.append(line)
            if len(parse(lines)) == keep:
                group.kill(gateway)
                break
    return parse(lines)


KILL_CONFIG = {"sessions": {"lease_ttl_s": 1.0, "checkpoint_interval_s": 0.05, "checkpoint_every_events": 4}}


def test_replica_sigkilled_at_several_points_loses_nothing(tmp_path: Path, sim: Announced) -> None:
    """Killed at the first event (well inside the first second), early and late in the stream:
    another replica finishes each answer once, under the client's request id, with whole usage,
    and the dead replica's quota reservation is settled instead of a second one being taken."""
    text, usage = expected(sim)
    config = gateway_config(deployment("a", sim), **KILL_CONFIG)
    with replicas_on_redis(tmp_path, config) as group:
        group.use_key(rpm=RPM, max_concurrency=1)
        before = served_count(sim)
        request_ids = set()
        points = (1, 2, 8, 40)
        for keep in points:
            owner, other = group.live
            session_id, request_id = f"s-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
            request_ids.add(request_id)
            started = time.monotonic()
            seen = kill_after(group, owner, session_id, request_id, keep)
            rest = resume(other, session_id, int(seen[-1][0] or 0))
            print(f"killed after {keep} events: resumed in {time.monotonic() - started:.2f}s")
            events = seen + rest
            assert [s for s, _ in events] == list(range(1, len(events) + 1))
            assert text_of(events) == text
            client_usage = usage_of(events)
            assert client_usage is not None
            assert client_usage["completion_tokens"] >= usage["completion_tokens"]
            # The continuation's prompt held the partial answer: not billed as the client's prompt.
            assert client_usage["prompt_tokens"] == usage["prompt_tokens"], (keep, client_usage)
            group.start()  # a replacement replica
        # One generation per session, and one continuation of it by the replica that took over.
        assert served_count(sim) - before == 2 * len(points)
        records = wait_for_records(group, request_ids)
        assert sorted(r["request_id"] for r in records) == sorted(request_ids)
        for record in records:
            assert record["status"] == 200, record
            assert record["completion_tokens"] >= usage["completion_tokens"], record
            assert record["prompt_tokens"] == usage["prompt_tokens"], record
            assert record["completion_sha256"] == hashlib.sha256(text.encode()).hexdigest()
        assert group.verify()["ok"]
        # Each request counted once, and no concurrency slot left with a dead replica.
        assert group.remaining_requests() == RPM - len(points) - 1


def test_a_stream_still_starts_while_the_store_is_down(tmp_path: Path, sim: Announced) -> None:
    """The lease cannot be taken then: the answer streams unowned (fail_open), rather than 503."""
    text, _ = expected(sim)
    server = start_redis()
    try:
        store = {"kind": "redis", "url": server.url, "socket_timeout_s": 0.2, "connect_timeout_s": 0.2}
        config = gateway_config(deployment("a", sim), store=store, quota={"on_store_error": "fail_open"})
        with gateway_process(tmp_path, config) as gateway:
            warm = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(), timeout=30)
            assert warm.status_code == 200  # the key is now in the replica's cache
            server.kill()
            # A new session (no X-Session-Id: naming an existing one needs the store to check who owns it).
            reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(), timeout=30)
            assert reply.status_code == 200, reply.text
            assert text_of(parse(reply.text.splitlines())) == text
    finally:
        server.kill()
