"""The quota stage keeps a concurrency lease alive while a response sends nothing for a long time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from gateway.core.chunks import Chunk
from gateway.core.principal import Limits, Principal
from gateway.errors import RateLimited
from gateway.pipeline import RequestContext
from gateway.quota.stage import Admit
from gateway.settings import EmbeddedStoreSettings, QuotaSettings
from gateway.store.embedded import EmbeddedStore
from gateway.surfaces.chat_completions import ChatCompletions

KEY = Principal("key_q", "acme", frozenset({"chat"}), frozenset(), Limits(max_concurrency=1))


def context() -> RequestContext:
    ctx = RequestContext(
        "r", "c", ChatCompletions(), model="m", body={"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    ctx.principal = KEY
    return ctx


@pytest.mark.timing
async def test_a_silent_response_keeps_its_concurrency_slot_past_the_lease_ttl(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    admit = Admit(store, QuotaSettings(lease_ttl_s=1.0))
    waiting = asyncio.Event()
    release = asyncio.Event()

    async def held_for_approval(_: RequestContext) -> AsyncGenerator[Chunk, None]:
        waiting.set()
        await release.wait()  # like a tool call waiting for a person: no chunk for a long time
        yield Chunk(content="ok")

    async def first() -> list[Chunk]:
        return [c async for c in admit(context(), held_for_approval)]

    async def nothing(_: RequestContext) -> AsyncGenerator[Chunk, None]:
        yield Chunk(content="second")

    running = asyncio.create_task(first())
    await waiting.wait()
    await asyncio.sleep(3.0)  # three lease lifetimes
    with pytest.raises(RateLimited):
        [c async for c in admit(context(), nothing)]
    release.set()
    assert [c.content for c in await running] == ["ok"]
    await admit.drain()
    assert [c.content async for c in admit(context(), nothing)] == ["second"], "the slot is free again"
    await store.aclose()
