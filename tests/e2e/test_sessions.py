"""Resumable streams and sessions: a client that reconnects loses and duplicates nothing."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from common.processes import Announced
from gateway.auth.stage import new_secret
from testkit.procs import (
    Gateway,
    GatewayProcess,
    delete_redis_prefix,
    deployment,
    gateway_config,
    gateway_process,
    redis_store_config,
    running_gateway,
)

MAX_TOKENS = 30
BODY = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "a resumable answer"}],
    "max_tokens": MAX_TOKENS,
    "stream": True,
}


def expected_text(sim: Announced) -> str:
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json={**BODY, "stream": False}, timeout=10)
    return str(reply.json()["choices"][0]["message"]["content"])


def parse(lines: list[str]) -> list[tuple[int, Any]]:
    """(id, payload) of each SSE event."""
    events: list[tuple[int, Any]] = []
    seq: int | None = None
    for line in lines:
        if line.startswith("id: "):
            seq = int(line[4:])
        elif line.startswith("data: "):
            assert seq is not None, f"an event before any id: {line}"
            payload = line[6:]
            events.append((seq, payload if payload == "[DONE]" else orjson.loads(payload)))
    return events


def text_of(events: list[tuple[int, Any]]) -> str:
    return "".join(
        p["choices"][0]["delta"].get("content") or "" for _, p in events if p != "[DONE]" and p.get("choices")
    )


def read_then_drop(gateway: Gateway, session_id: str, keep: int) -> list[tuple[int, Any]]:
    """Read `keep` events of a new stream, then drop the connection."""
    lines: list[str] = []
    headers = {**gateway.headers(), "X-Session-Id": session_id}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=20) as reply:
        assert reply.headers["X-Session-Id"] == session_id
        for line in reply.iter_lines():
            lines.append(line)
            if len(parse(lines)) == keep:
                break
    return parse(lines)


def resume(gateway: Gateway, session_id: str, last_id: int) -> list[tuple[int, Any]]:
    headers = {**gateway.headers(), "Last-Event-ID": str(last_id)}
    reply = httpx.get(f"{gateway.url}/v1/sessions/{session_id}/stream", headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    return parse(reply.text.splitlines())


@pytest.fixture(scope="module", params=["embedded", "redis"])
def gateway(
    request: pytest.FixtureRequest, slow_sim: Announced, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The same session behaviour on both stores."""
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    store = {"store": redis_store_config(prefix)} if request.param == "redis" else {}
    config = gateway_config(deployment("a", slow_sim), sessions={"transcript_tenants": ["initech"]}, **store)
    try:
        with running_gateway(tmp_path_factory.mktemp("sessions"), config) as running:
            yield running
    finally:
        delete_redis_prefix(prefix)


@pytest.mark.parametrize("keep", [1, 2, 7, 15, 24])
def test_client_disconnect_then_resume_loses_and_repeats_nothing(
    gateway: Gateway, slow_sim: Announced, keep: int
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    first = read_then_drop(gateway, session_id, keep)
    rest = resume(gateway, session_id, first[-1][0])
    ids = [seq for seq, _ in first + rest]
    assert ids == list(range(1, len(ids) + 1)), "every id once, in order"
    assert rest[-1][1] == "[DONE]"
    assert text_of(first + rest) == expected_text(slow_sim)


def test_resume_after_the_end_replays_from_the_checkpoint(gateway: Gateway, slow_sim: Announced) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    whole = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=BODY,
        headers={**gateway.headers(), "X-Session-Id": session_id},
        timeout=20,
    )
    events = parse(whole.text.splitlines())
    replay = resume(gateway, session_id, 3)
    assert replay == events[3:]


def test_transcript_append_mode_and_delete(gateway: Gateway) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    headers = {**gateway.headers(), "X-Session-Id": session_id}
    url = f"{gateway.url}/v1/chat/completions"
    first = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    answer = httpx.post(url, json=first, headers=headers, timeout=10).json()["choices"][0]["message"]["content"]
    follow_up = {"model": "sim-model", "messages": [{"role": "user", "content": "and then?"}], "max_tokens": 4}
    httpx.post(url, json=follow_up, headers={**headers, "X-Session-Append": "true"}, timeout=10).raise_for_status()
    transcript = transcript_of(gateway, session_id, headers)
    assert [m["role"] for m in transcript["messages"]] == ["user", "assistant", "user", "assistant"]
    assert transcript["messages"][1]["content"] == answer
    _, other_tenant = gateway.create_key(tenant="globex")
    foreign = httpx.get(f"{gateway.url}/v1/sessions/{session_id}", headers=gateway.headers(other_tenant), timeout=10)
    assert foreign.status_code == 404
    deleted = httpx.delete(f"{gateway.url}/v1/sessions/{session_id}", headers=headers, timeout=10)
    assert deleted.status_code == 200
    assert httpx.get(f"{gateway.url}/v1/sessions/{session_id}", headers=headers, timeout=10).status_code == 404


def transcript_of(gateway: Gateway, session_id: str, headers: dict[str, str]) -> dict[str, Any]:
    # The transcript is saved off the response path; the next read of the session waits for nothing
    # else, so poll it a bounded number of times.
    for _ in range(50):
        reply = httpx.get(f"{gateway.url}/v1/sessions/{session_id}", headers=headers, timeout=10)
        if reply.status_code == 200 and len(reply.json()["messages"]) == 4:
            return dict(reply.json())
    pytest.fail(f"transcript never complete: {reply.text}")


def done(gateway: Gateway, session_id: str, headers: dict[str, str]) -> dict[str, Any]:
    """The session once its last write (off the response path) has landed: bounded wait."""
    deadline = time.monotonic() + 10
    while True:
        reply = httpx.get(f"{gateway.url}/v1/sessions/{session_id}", headers=headers, timeout=10)
        if reply.status_code == 200 and reply.json()["status"] == "done":
            return dict(reply.json())
        assert time.monotonic() < deadline, reply.text
        time.sleep(0.02)


def test_a_request_naming_no_session_keeps_no_transcript(gateway: Gateway) -> None:
    url, headers = f"{gateway.url}/v1/chat/completions", gateway.headers()
    plain = httpx.post(url, json={**BODY, "stream": False}, headers=headers, timeout=20)
    assert plain.status_code == 200
    # Saves are started in order, so once a later opted-in answer is stored, this one would be.
    named = f"s-{uuid.uuid4().hex[:8]}"
    opted = httpx.post(url, json={**BODY, "stream": False}, headers={**headers, "X-Session-Id": named}, timeout=20)
    assert opted.status_code == 200
    assert [m["role"] for m in done(gateway, named, headers)["messages"]] == ["user", "assistant"]
    plain_id = plain.headers["X-Session-Id"]
    assert httpx.get(f"{gateway.url}/v1/sessions/{plain_id}", headers=headers, timeout=10).status_code == 404


def test_a_stream_naming_no_session_stays_resumable_without_its_transcript(gateway: Gateway) -> None:
    whole = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(), timeout=20)
    session_id = whole.headers["X-Session-Id"]
    events = parse(whole.text.splitlines())
    assert done(gateway, session_id, gateway.headers())["messages"] == []
    assert resume(gateway, session_id, 3) == events[3:]


def test_config_keeps_the_transcripts_of_a_listed_tenant(gateway: Gateway) -> None:
    _, key = gateway.create_key(tenant="initech")
    body = {**BODY, "stream": False}
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(key), timeout=20)
    assert reply.status_code == 200
    kept = done(gateway, reply.headers["X-Session-Id"], gateway.headers(key))
    assert [m["role"] for m in kept["messages"]] == ["user", "assistant"]
    assert kept["messages"][0]["content"] == BODY["messages"][0]["content"]  # type: ignore[index]


def test_bad_session_id_is_400(gateway: Gateway) -> None:
    headers = {**gateway.headers(), "X-Session-Id": "spaces are not allowed"}
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "X-Session-Id"


def test_replica_sigkilled_mid_stream_resumes_on_another_replica(tmp_path: Path, slow_sim: Announced) -> None:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(
        deployment("a", slow_sim),
        store=redis_store_config(prefix),
        sessions={"lease_ttl_s": 1.0, "checkpoint_interval_s": 0.05, "checkpoint_every_events": 4},
    )
    admin_key = new_secret()
    try:
        with ExitStack() as stack:
            first = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
            second = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            second.key = first.key
            for keep in (3, 12):
                session_id = f"s-{uuid.uuid4().hex[:8]}"
                seen = read_then_drop_killing(first, session_id, keep)
                rest = resume(second, session_id, seen[-1][0])
                assert [s for s, _ in seen + rest] == list(range(1, len(seen) + len(rest) + 1))
                assert text_of(seen + rest) == expected_text(slow_sim)
                first = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
                first.key = second.key
    finally:
        delete_redis_prefix(prefix)


def read_then_drop_killing(gateway: GatewayProcess, session_id: str, keep: int) -> list[tuple[int, Any]]:
    lines: list[str] = []
    headers = {**gateway.headers(), "X-Session-Id": session_id}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=20) as reply:
        for line in reply.iter_lines():
            lines.append(line)
            if len(parse(lines)) == keep:
                os.kill(gateway.process.process.pid, signal.SIGKILL)
                break
    gateway.process.process.wait(10)
    return parse(lines)


def test_resume_after_a_second_turn_replays_the_latest_answer(gateway: Gateway) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    headers = {**gateway.headers(), "X-Session-Id": session_id}
    url = f"{gateway.url}/v1/chat/completions"
    httpx.post(url, json=BODY, headers=headers, timeout=20).raise_for_status()
    second = {**BODY, "messages": [{"role": "user", "content": "a different question"}]}
    latest = parse(httpx.post(url, json=second, headers=headers, timeout=20).text.splitlines())
    deadline = time.monotonic() + 5
    while resume(gateway, session_id, 0) != latest:  # the last checkpoint lands off the response path
        assert time.monotonic() < deadline, "the stored events never became the second answer's"
        time.sleep(0.05)


def test_a_session_without_a_streamed_answer_cannot_be_resumed(gateway: Gateway) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    headers = {**gateway.headers(), "X-Session-Id": session_id}
    plain = {**BODY, "stream": False}
    httpx.post(f"{gateway.url}/v1/chat/completions", json=plain, headers=headers, timeout=20).raise_for_status()
    deadline = time.monotonic() + 5
    while True:  # the transcript is saved off the response path
        reply = httpx.get(f"{gateway.url}/v1/sessions/{session_id}/stream", headers=gateway.headers(), timeout=10)
        if reply.status_code == 404 and "no streamed response" in reply.text:
            break
        assert time.monotonic() < deadline, reply.text
        time.sleep(0.05)


def test_cancel_on_disconnect_ends_the_stream_for_a_later_reader(slow_sim: Announced, tmp_path: Path) -> None:
    config = gateway_config(deployment("a", slow_sim), sessions={"on_client_disconnect": "cancel"})
    with running_gateway(tmp_path, config) as gateway:
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        seen = read_then_drop(gateway, session_id, 3)
        rest = resume(gateway, session_id, seen[-1][0])  # returns: the cancelled stream was closed
    assert rest[-1][1] == "[DONE]"
    assert "cancelled" in str(rest[-2][1])
