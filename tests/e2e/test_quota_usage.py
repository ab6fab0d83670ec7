"""Token quotas hold against what the backend really sends: a request without `max_tokens` is
capped at its reservation, and a backend's usage figures are checked against the gateway's own
count of what it relayed (too low: the count wins; impossible: the count replaces them)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import orjson
import pytest

from common.processes import Announced
from gateway.auth.stage import new_secret
from gateway.tokens import CHARS_PER_TOKEN_FLOOR, estimate_prompt_tokens
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
)

DEFAULT_MAX_TOKENS = 100
TPM = 1000
BODY: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "write at length"}]}
RESERVATION = estimate_prompt_tokens(BODY) + DEFAULT_MAX_TOKENS


@pytest.fixture(scope="module")
def replicas(sim: Announced, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Gateway]]:
    """Two gateway processes sharing one Redis prefix."""
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(
        deployment("a", sim, timeouts={"connect_s": 1, "first_token_s": 5, "stall_s": 5}),
        store={**redis_store_config(prefix), "socket_timeout_s": 3, "connect_timeout_s": 3},
        quota={"on_store_error": "fail_closed", "default_max_tokens": DEFAULT_MAX_TOKENS},
        routing={"retry": {"max_attempts": 1}},
    )
    path = tmp_path_factory.mktemp("replicas")
    admin_key = new_secret()
    try:
        with ExitStack() as stack:
            first = stack.enter_context(running_gateway(path, config, admin_key=admin_key))
            second = stack.enter_context(running_gateway(path, config, admin_key=admin_key))
            yield first, second
    finally:
        delete_redis_prefix(prefix)


@pytest.fixture(autouse=True)
def healthy_again(sim: Announced) -> Iterator[None]:
    yield
    reset(sim)


def answer_of(reply: httpx.Response, stream: bool) -> tuple[str, str | None, dict[str, Any]]:
    """(text, finish_reason, usage) of a chat completion, streamed or not."""
    assert reply.status_code == 200, reply.text
    if not stream:
        document = reply.json()
        choice = document["choices"][0]
        return choice["message"]["content"] or "", choice["finish_reason"], document["usage"]
    events = [orjson.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    assert not any("error" in e for e in events), events
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    usages = [e["usage"] for e in events if e.get("usage")]
    assert len(finishes) == 1, events
    assert len(usages) == 1, events
    return text, finishes[0], usages[0]


def body_for(stream: bool, **extra: Any) -> dict[str, Any]:
    return {**BODY, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {}), **extra}


def tokens_charged(gateway: Gateway, key: str, limit: int) -> int:
    """What the key's TPM window holds, read off a probe's rate-limit headers (the probe's own
    reservation taken out); a probe refused for tokens means the window is past the limit."""
    probe = {**BODY, "max_tokens": 1}
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=probe, headers=gateway.headers(key), timeout=30)
    if reply.status_code == 429:
        return limit + 1
    assert reply.status_code == 200, reply.text
    return limit - int(reply.headers["x-ratelimit-remaining-tokens"]) - (estimate_prompt_tokens(probe) + 1)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "collected"])
async def test_requests_without_max_tokens_are_capped_at_their_reservation_across_two_replicas(
    replicas: tuple[Gateway, Gateway], sim: Announced, stream: bool
) -> None:
    """The backend writes 5,000 tokens whatever it is asked (issue 29 item 2: three concurrent
    requests on a `tpm: 1000` key were charged 10,000)."""
    first, second = replicas
    set_faults(sim, length=5000, chunk_tokens=10)
    _, key = first.create_key(tpm=TPM)
    async with httpx.AsyncClient(timeout=60) as client:
        replies = await asyncio.gather(
            *(
                client.post(f"{g.url}/v1/chat/completions", json=body_for(stream), headers=g.headers(key))
                for g in (first, second, first)
            )
        )
    answers = [answer_of(reply, stream) for reply in replies]
    for text, finish, usage in answers:
        assert finish == "length"
        assert usage["completion_tokens"] <= DEFAULT_MAX_TOKENS
        assert len(text) <= DEFAULT_MAX_TOKENS * CHARS_PER_TOKEN_FLOOR
    assert sum(usage["total_tokens"] for _, _, usage in answers) <= TPM + RESERVATION
    assert tokens_charged(second, key, TPM) <= TPM + RESERVATION


def test_an_honest_backend_is_sent_the_reservation_as_max_tokens(
    replicas: tuple[Gateway, Gateway], sim: Announced
) -> None:
    first, _ = replicas
    _, key = first.create_key(tpm=TPM)
    reply = httpx.post(f"{first.url}/v1/chat/completions", json=body_for(False), headers=first.headers(key), timeout=30)
    _, finish, usage = answer_of(reply, False)
    # The sim writes exactly max_tokens when it is given one, and says "length".
    assert (finish, usage["completion_tokens"]) == ("length", DEFAULT_MAX_TOKENS)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "collected"])
def test_usage_reported_as_zero_is_charged_what_was_relayed(
    replicas: tuple[Gateway, Gateway], sim: Announced, stream: bool
) -> None:
    """A backend reporting usage 0 for 10,000 characters (issue 29 item 3: 10 of 10 admitted on
    `tpm: 300`, and `max_tokens: 20` not enforced)."""
    first, second = replicas
    set_faults(sim, length=2000, chunk_tokens=200, usage=0)
    _, key = first.create_key(tpm=300)
    statuses = []
    for index in range(10):
        gateway = (first, second)[index % 2]
        url, headers = f"{gateway.url}/v1/chat/completions", gateway.headers(key)
        reply = httpx.post(url, json=body_for(stream), headers=headers, timeout=30)
        statuses.append(reply.status_code)
        if reply.status_code == 200:
            text, _, usage = answer_of(reply, stream)
            assert usage["completion_tokens"] * CHARS_PER_TOKEN_FLOOR >= len(text) > 0
    assert statuses.count(200) <= 300 // RESERVATION + 1, statuses
    capped = body_for(stream, max_tokens=20)
    reply = httpx.post(f"{first.url}/v1/chat/completions", json=capped, headers=first.headers(), timeout=30)
    text, finish, usage = answer_of(reply, stream)
    assert finish == "length"
    assert usage["completion_tokens"] == 20
    assert len(text) <= 20 * CHARS_PER_TOKEN_FLOOR


def request_records(gateway: Gateway, request_ids: set[str]) -> list[dict[str, Any]]:
    records = audit_records(gateway, "request", lambda found: {r["request_id"] for r in found} >= request_ids)
    return [r for r in records if r["request_id"] in request_ids]


@pytest.mark.parametrize("lie", ["-1", "1.5", "18446744073709551616", "1e308"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "collected"])
def test_impossible_usage_is_replaced_by_the_gateways_count_and_the_connection_kept(
    replicas: tuple[Gateway, Gateway], sim: Announced, lie: str, stream: bool
) -> None:
    """Negative, fractional or beyond any size: today a 500, a reset connection and an
    `audit_error` record that lost the key, tenant and model (issue 29 item 3)."""
    first, _ = replicas
    set_faults(sim, usage=lie)
    _, key = first.create_key(tpm=100_000)  # metered: the record says what was charged
    request_ids = {f"usage-{uuid.uuid4().hex[:8]}", f"usage-{uuid.uuid4().hex[:8]}"}
    with httpx.Client(timeout=30) as client:  # one keep-alive connection for both requests
        for request_id in sorted(request_ids):
            headers = {**first.headers(key), "X-Request-Id": request_id}
            reply = client.post(
                f"{first.url}/v1/chat/completions", json=body_for(stream, max_tokens=8), headers=headers
            )
            text, finish, usage = answer_of(reply, stream)
            assert (len(text.split()), finish) == (8, "length")
            assert usage["completion_tokens"] == 8
            assert usage["prompt_tokens"] == estimate_prompt_tokens(BODY)
            assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    records = request_records(first, request_ids)
    assert sorted(r["request_id"] for r in records) == sorted(request_ids)
    for record in records:
        assert (record["kind"], record["surface"], record["status"], record["tenant"], record["model"]) == (
            "request",
            "chat.completions",
            200,
            "acme",
            "sim-model",
        )
        assert record["key_id"]
        assert record["completion_tokens"] == 8
        assert record["relayed_tokens"] == 8
        assert record["charged_tokens"] == record["prompt_tokens"] + 8
