"""The quota stage on its own, over the embedded store: what it admits and refuses, what a refusal
says, and that a request gives back its concurrency slot however it ends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from gateway.core.chunks import Chunk, Usage
from gateway.core.principal import Limits, Principal
from gateway.errors import InsufficientQuota, RateLimited, UpstreamError
from gateway.pipeline import RequestContext
from gateway.quota.stage import Admit
from gateway.settings import EmbeddedStoreSettings, QuotaSettings
from gateway.store.embedded import EmbeddedStore
from gateway.surfaces.chat_completions import ChatCompletions

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    yield store
    await store.aclose()


def request_of(limits: Limits, key_id: str = "key_q") -> RequestContext:
    ctx = RequestContext("r", "c", ChatCompletions(), model="m", body=dict(BODY))
    ctx.principal = Principal(key_id, "acme", frozenset({"chat"}), frozenset(), limits)
    return ctx


async def answered(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
    yield Chunk(content="ok", usage=Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4))


async def failing(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
    raise UpstreamError("the backend broke")
    yield Chunk()  # pragma: no cover (makes this a generator)


async def run(admit: Admit, ctx: RequestContext, call_next: object = answered) -> list[str | None]:
    return [chunk.content async for chunk in admit(ctx, call_next)]  # type: ignore[arg-type]


async def test_rpm_admits_exactly_its_limit_and_the_refusal_says_when_to_come_back(store: EmbeddedStore) -> None:
    admit = Admit(store, QuotaSettings())
    limits = Limits(rpm=3)
    for _ in range(3):
        assert await run(admit, request_of(limits)) == ["ok"]
    with pytest.raises(RateLimited) as refused:
        await run(admit, request_of(limits))
    assert refused.value.status == 429
    assert 0 < float(refused.value.headers()["Retry-After"]) <= 60
    assert await run(admit, request_of(limits, key_id="key_other")) == ["ok"], "another key has its own window"
    await admit.drain()


@pytest.mark.parametrize("call_next", [answered, failing], ids=["answered", "failed"])
async def test_a_request_gives_back_its_concurrency_slot_however_it_ends(
    store: EmbeddedStore, call_next: object
) -> None:
    admit = Admit(store, QuotaSettings())
    limits = Limits(max_concurrency=1)
    for _ in range(3):  # one slot, used one request after another
        with contextlib.suppress(UpstreamError):  # the failed one: refused it would be RateLimited
            await run(admit, request_of(limits), call_next)
        await admit.drain()


async def test_a_client_gone_mid_answer_gives_back_its_slot(store: EmbeddedStore) -> None:
    admit = Admit(store, QuotaSettings())
    limits = Limits(max_concurrency=1)

    async def long_answer(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
        for _ in range(100):
            yield Chunk(content="tok")

    chunks = admit(request_of(limits), long_answer)
    assert (await anext(chunks)).content == "tok"
    with pytest.raises(RateLimited):
        await run(admit, request_of(limits))  # the slot is held while the answer streams
    await chunks.aclose()  # the client went away
    await admit.drain()
    assert await run(admit, request_of(limits)) == ["ok"]
    await admit.drain()


async def test_a_spent_daily_budget_is_insufficient_quota_before_the_call(store: EmbeddedStore) -> None:
    admit = Admit(store, QuotaSettings())
    called: list[RequestContext] = []

    async def recorded(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
        called.append(ctx)
        yield Chunk(content="ok")

    with pytest.raises(InsufficientQuota):
        await run(admit, request_of(Limits(daily_tokens=1)), recorded)
    assert called == [], "refused before anything went upstream"
