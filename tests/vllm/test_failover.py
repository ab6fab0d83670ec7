"""Mid-stream failover on real vLLM: the engine serving a greedy stream is SIGKILLed (API server and
engine core together) at several points of the answer; another engine continues it with
`continue_final_message`, and the client's text equals vLLM's own uninterrupted answer, character
for character. Usage summed across the hand-over is what the audit (and so the quota) charged.
Each point is on another API: an Anthropic Messages stream (issue 32), a Responses API stream
(issue 31) and a chat stream: the same guarantee on every surface."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.store.keys import scope_keys
from testkit.procs import GatewayProcess, delete_redis_prefix, gateway_process, redis_store_config, shared_redis_url
from tests.vllm.client import (
    MODEL,
    ZEN_PROMPT,
    chat_body,
    direct_answer,
    metric_total,
    respond_through,
    stream_through,
    vllm_deployment,
    vllm_gateway_config,
)
from tests.vllm.conftest import Pool
from tests.vllm.tap import Tap

# Engine starts and the model build happen in the first test's fixtures: minutes, not seconds.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

MAX_TOKENS = 380  # shorter than the answer (421 characters): it ends on the length limit


@pytest.fixture(scope="module")
def reference(pool: Pool) -> dict[str, Any]:
    (server,) = pool.ready("a")
    return direct_answer(server, chat_body(max_tokens=MAX_TOKENS))


def request_audit(gateway: Any) -> dict[str, Any]:
    """The newest request record, once the audit writer (which flushes in the background) has
    written one: bounded wait."""
    records: list[dict[str, Any]] = []
    for _ in range(200):
        reply = httpx.get(
            f"{gateway.url}/admin/audit",
            params={"kind": "request"},
            headers=gateway.headers(gateway.admin_key),
            timeout=10,
        )
        records = [r for r in reply.json()["data"] if r.get("kind") == "request"]
        if records:
            break
        time.sleep(0.1)
    assert records, "no request record was written"
    return dict(records[-1])


def settled_tokens(prefix: str, key_id: str, expected: int | None, timeout_s: float = 20) -> int:
    """The tokens the quota counted today for the key, once settled to `expected` (the settlement
    replaces the reservation in a task of its own, after the response ended): bounded wait."""
    client = redis.Redis.from_url(shared_redis_url(), socket_timeout=5)
    daily = scope_keys(prefix, "acme", f"key:{key_id}").daily
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            counted = sum(int(v) for v in client.hvals(daily))
            if counted == expected or time.monotonic() > deadline:
                return counted
            time.sleep(0.05)
    finally:
        client.close()


@dataclass(frozen=True)
class Streamed:
    """What a client of either surface was told, in the chat form's terms."""

    text: str
    usage: dict[str, int]
    ended_by_length: bool
    one_answer: bool
    errors: list[Any]


def stream_chat(gateway: GatewayProcess, key: str) -> Streamed:
    result = stream_through(gateway, chat_body(max_tokens=MAX_TOKENS), key=key)
    ended = result.events[-1] == "[DONE]" and result.finish_reasons == ["length"]
    return Streamed(result.text, result.usage, ended, len(result.ids) == 1, result.errors)


def stream_responses(gateway: GatewayProcess, key: str) -> Streamed:
    body = {"model": MODEL, "input": ZEN_PROMPT, "max_output_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    result = respond_through(gateway, body, key=key)
    final, usage = result.final, result.final["usage"]
    sequence = [event["sequence_number"] for event in result.events]
    ended = (
        result.events[-1]["type"] == "response.incomplete"
        and final["incomplete_details"]["reason"] == "max_output_tokens"
    )
    return Streamed(
        result.text,
        {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["total_tokens"],
        },
        ended and final["output"][0]["content"][0]["text"] == result.text,
        sequence == list(range(len(sequence)))
        and len({e["response"]["id"] for e in result.events if "response" in e}) == 1,
        [e for e in result.events if e["type"] in ("error", "response.failed")],
    )


def stream_messages(gateway: GatewayProcess, key: str) -> Streamed:
    body = {"model": MODEL, "messages": [{"role": "user", "content": ZEN_PROMPT}], "max_tokens": MAX_TOKENS}
    result = respond_through(gateway, {**body, "temperature": 0, "stream": True}, key=key, path="/v1/messages")
    events = result.events
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    usage = delta["usage"]
    return Streamed(
        text,
        {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["input_tokens"] + usage["output_tokens"],
        },
        delta["delta"]["stop_reason"] == "max_tokens" and events[-1]["type"] == "message_stop",
        [e["type"] for e in events].count("message_start") == 1,
        [e for e in events if e["type"] == "error"],
    )


@pytest.mark.parametrize(("position", "surface"), [(1, stream_messages), (120, stream_responses), (300, stream_chat)])
def test_sigkill_mid_stream_continues_exactly(
    pool: Pool,
    reference: dict[str, Any],
    tmp_path: Path,
    figures: dict[str, Any],
    position: int,
    surface: Callable[[GatewayProcess, str], Streamed],
) -> None:
    expected = reference["choices"][0]["message"]["content"]
    prompt_tokens = reference["usage"]["prompt_tokens"]
    assert len(expected) == MAX_TOKENS  # one character a token: the limit cut the answer
    # Whichever engine is up serves first; one restarted by an earlier case is the fallback.
    names = ["a", "b"] if pool.servers["a"].ready_s is not None else ["b", "a"]
    primary, fallback = pool.ready(*names)
    tap = Tap(primary.port)
    trigger = tap.arm(position, primary.kill)
    deployments = [
        vllm_deployment(names[0], primary, via=tap.url, priority=0),
        vllm_deployment(names[1], fallback, priority=1),
    ]
    fallback_prompt = metric_total(fallback, "vllm:prompt_tokens_total")
    fallback_generated = metric_total(fallback, "vllm:generation_tokens_total")
    prefix = f"agw-vllm-{uuid.uuid4().hex[:8]}"
    config = vllm_gateway_config(*deployments, store=redis_store_config(prefix))
    try:
        with gateway_process(tmp_path, config) as gateway:
            key_id, key = gateway.create_key(daily_tokens=10_000_000)  # a limit: the quota counts its tokens
            result = surface(gateway, key)
            audit = request_audit(gateway)
            charged = settled_tokens(prefix, key_id, result.usage.get("total_tokens"))
    finally:
        tap.close()
        pool.restart(names[0])  # in the background: the next case that needs it waits
        delete_redis_prefix(prefix)

    assert trigger.fired
    assert not result.errors, result.errors
    assert result.one_answer  # one id (and, for Responses, one unbroken run of sequence numbers)
    assert audit["deployments"] == names, audit  # it really was handed over
    # The continuation's prompt is the original one plus what the client already had; that part
    # is recorded as the continuation's cost, not billed as the client's prompt.
    handed_over_at = audit["continuation_prompt_tokens"]
    figures.setdefault("failover_positions", []).append(
        {"killed_after_events": position, "handed_over_at_token": handed_over_at, "surface": audit["surface"]}
    )
    assert result.text == expected
    assert result.ended_by_length
    # Usage: the dead engine's tokens (as streamed) + the continuation's own usage, nothing lost.
    usage = result.usage
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["total_tokens"] == prompt_tokens + MAX_TOKENS
    assert (audit["prompt_tokens"], audit["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert charged == usage["total_tokens"], "the quota charged what the client was told"
    # The survivor's own counters agree with what it was sent: the client's prompt, the resent part, the rest.
    assert metric_total(fallback, "vllm:prompt_tokens_total") - fallback_prompt == prompt_tokens + handed_over_at
    assert metric_total(fallback, "vllm:generation_tokens_total") - fallback_generated == MAX_TOKENS - handed_over_at
