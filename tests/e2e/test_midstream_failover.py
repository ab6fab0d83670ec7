"""Mid-stream failover: whatever breaks after the first token, the client's text is the text of an
uninterrupted run, character for character, with one completion id and no error."""

from __future__ import annotations

import os
import random
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from common.processes import Announced
from testkit.procs import (
    Gateway,
    audit_records,
    delete_redis_prefix,
    deployment,
    gateway_config,
    redis_store_config,
    reset,
    running_gateway,
    set_faults,
    start_sim,
)

MAX_TOKENS = 36
BODY = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "a long answer, please"}],
    "max_tokens": MAX_TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}
SLOW_ENOUGH_TO_KILL = ["--tpot-ms", "8"]  # the kill must land while the backend is still streaming


def uninterrupted_text(sim: Announced) -> str:
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json={**BODY, "stream": False}, timeout=10)
    return str(reply.json()["choices"][0]["message"]["content"])


def events_of(lines: list[str]) -> list[Any]:
    return [
        orjson.loads(line[6:]) if line != "data: [DONE]" else "[DONE]" for line in lines if line.startswith("data: ")
    ]


def assembled(events: list[Any]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e != "[DONE]" and e.get("choices"))


def check_one_clean_stream(events: list[Any], expected: str) -> None:
    assert events[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and "error" in e for e in events), events
    assert assembled(events) == expected
    assert len({e["id"] for e in events if e != "[DONE]"}) == 1
    roles = [e for e in events if e != "[DONE]" and e["choices"] and "role" in e["choices"][0]["delta"]]
    assert len(roles) == 1
    assert events[-2]["usage"]["completion_tokens"] >= MAX_TOKENS


@pytest.fixture(scope="module")
def fallback() -> Iterator[Announced]:
    sim = start_sim()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def sims(fallback: Announced) -> Iterator[tuple[Announced, Announced]]:
    primary = start_sim(*SLOW_ENOUGH_TO_KILL)
    reset(fallback)
    try:
        yield primary, fallback
    finally:
        primary.stop()


def failover_config(
    primary_url: str, fallback: Announced, primary_continuation: str = "vllm", **fallback_overrides: Any
) -> dict[str, Any]:
    first = {
        "name": "primary",
        "api_base": f"{primary_url}/v1",
        "model": "sim-model",
        "continuation": primary_continuation,
        "timeouts": {"connect_s": 1, "first_token_s": 2, "stall_s": 0.5},
    }
    return gateway_config(
        first,
        deployment("fallback", fallback, priority=1, **fallback_overrides),
        routing={"breaker": {"failure_threshold": 1000}},
    )


def stream_killing_at(gateway: Gateway, primary: Announced, kill_after: int) -> list[Any]:
    """Stream through the gateway and SIGKILL the serving backend once `kill_after` tokens arrived."""
    lines, tokens = [], 0
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(), timeout=20
    ) as reply:
        for line in reply.iter_lines():
            lines.append(line)
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                tokens += 1
                if tokens == kill_after:
                    os.kill(primary.process.pid, signal.SIGKILL)
    return events_of(lines)


@pytest.mark.chaos  # kills a backend process 60 times: the chaos lane
@pytest.mark.parametrize("store", ["embedded", "redis"])
def test_backend_sigkilled_at_30_positions_never_changes_the_text(
    tmp_path: Path, fallback: Announced, store: str
) -> None:
    positions = sorted(random.Random(20261129).sample(range(1, MAX_TOKENS - 2), 30))
    expected = uninterrupted_text(fallback)
    primary = start_sim(*SLOW_ENOUGH_TO_KILL)
    port = int(primary.url.rsplit(":", 1)[1])
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = failover_config(primary.url, fallback)
    if store == "redis":
        config["store"] = redis_store_config(prefix)
    try:
        with running_gateway(tmp_path, config) as gateway:
            for k in positions:
                events = stream_killing_at(gateway, primary, k)
                check_one_clean_stream(events, expected)
                primary.process.wait(10)
                primary.stop()
                primary = start_sim(*SLOW_ENOUGH_TO_KILL, port=port)  # same port: the gateway's config
    finally:
        primary.stop()
        delete_redis_prefix(prefix)


@pytest.fixture(params=["embedded", "redis"])
def store_config(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The same behaviour on both stores: sessions checkpoint every stream."""
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    yield {"store": redis_store_config(prefix)} if request.param == "redis" else {}
    delete_redis_prefix(prefix)


@pytest.mark.parametrize(
    "fault",
    [{"stall_after": 7}, {"malformed_after": 7}, {"inband_error_after": 7}, {"cut_after": 7}],
    ids=["stall", "malformed chunk", "in-band error", "connection cut"],
)
def test_mid_stream_fault_is_continued_by_the_fallback(
    tmp_path: Path, sims: tuple[Announced, Announced], fault: dict[str, int], store_config: dict[str, Any]
) -> None:
    primary, fallback = sims
    expected = uninterrupted_text(fallback)
    set_faults(primary, **fault)
    with running_gateway(tmp_path, {**failover_config(primary.url, fallback), **store_config}) as gateway:
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(), timeout=20)
        collected = httpx.post(
            f"{gateway.url}/v1/chat/completions", json={**BODY, "stream": False}, headers=gateway.headers(), timeout=20
        )
    check_one_clean_stream(events_of(reply.text.splitlines()), expected)
    assert collected.status_code == 200
    assert collected.json()["choices"][0]["message"]["content"] == expected


def test_fallback_that_cannot_continue_ends_with_an_in_band_error(
    tmp_path: Path, sims: tuple[Announced, Announced], store_config: dict[str, Any]
) -> None:
    primary, fallback = sims
    set_faults(primary, cut_after=5)
    config = {
        **failover_config(primary.url, fallback, primary_continuation="none", continuation="none"),
        **store_config,
    }
    with running_gateway(tmp_path, config) as gateway:
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(), timeout=20)
    events = events_of(reply.text.splitlines())
    assert reply.status_code == 200
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "service_unavailable"
    assert "continue" in events[-2]["error"]["message"]
    assert len(assembled(events).split()) == 5


def uninterrupted_usage(sim: Announced) -> dict[str, Any]:
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json={**BODY, "stream": False}, timeout=10)
    return dict(reply.json()["usage"])


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "collected"])
def test_a_continued_answer_bills_the_clients_prompt_not_the_partial_answer(
    tmp_path: Path, sims: tuple[Announced, Announced], stream: bool
) -> None:
    """The continuation's prompt holds the partial answer; billed as prompt, the tenant paid for
    it twice (issue 29 item 9: a ~7-token prompt reported as 19 to 123 tokens)."""
    primary, fallback = sims
    clean = uninterrupted_usage(fallback)
    with running_gateway(tmp_path, failover_config(primary.url, fallback)) as gateway:
        for cut in (3, 12, 30):
            set_faults(primary, cut_after=cut)
            request_id = f"cont-{uuid.uuid4().hex[:8]}"
            headers = {**gateway.headers(), "X-Request-Id": request_id}
            body = {**BODY, "stream": stream}
            reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=20)
            usage = events_of(reply.text.splitlines())[-2]["usage"] if stream else reply.json()["usage"]
            assert usage["prompt_tokens"] == clean["prompt_tokens"], (cut, usage)
            assert usage["completion_tokens"] == MAX_TOKENS
            assert usage["total_tokens"] == clean["prompt_tokens"] + MAX_TOKENS
            record = audited_request(gateway, request_id)
            assert record["prompt_tokens"] == clean["prompt_tokens"]
            assert record["continuation_prompt_tokens"] == cut  # the partial answer, resent once


def audited_request(gateway: Gateway, request_id: str) -> dict[str, Any]:
    records = audit_records(gateway, "request", lambda found: any(r["request_id"] == request_id for r in found))
    found = [r for r in records if r["request_id"] == request_id]
    assert len(found) == 1, found
    return found[0]
