"""Session checkpoints against a store that is down back off and log rarely (issue 12 item 7:
~250 warnings a second per replica, each an immediate retry)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator

import pytest

from gateway.core.chunks import Chunk
from gateway.core.surface import Surfaces
from gateway.pipeline import RequestContext
from gateway.sessions.event_log import SessionLog
from gateway.sessions.live import LiveSession
from gateway.sessions.manager import SessionManager
from gateway.settings import RedisStoreSettings, SessionSettings
from gateway.store.redis_store import RedisStore
from gateway.store.session_record import SessionState
from gateway.surfaces.chat_completions import ChatCompletions
from tests.store.test_redis_unavailable import free_port


async def never_called(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
    raise AssertionError("no takeover here")
    yield  # pragma: no cover


async def test_checkpoints_back_off_and_log_rarely_while_the_store_is_down(caplog: pytest.LogCaptureFixture) -> None:
    store = RedisStore(RedisStoreSettings(url=f"redis://127.0.0.1:{free_port()}/0", key_prefix="agw-test"))
    manager = SessionManager(store, SessionSettings(), "replica-1", never_called, Surfaces([ChatCompletions()]))
    live = LiveSession("acme", "s1", SessionLog(), SessionState("streaming"), ChatCompletions())
    manager._live.by_key[("acme", "s1")] = live  # a stream in progress, as `start` leaves it
    with caplog.at_level(logging.INFO, logger="gateway.sessions"):
        manager.start_checkpoints()
        try:
            until = time.monotonic() + 1.5
            while time.monotonic() < until:  # a busy stream asks for a checkpoint every 10 ms
                live.log.append(b"data: {}")
                manager._live.wakeup.set()
                await asyncio.sleep(0.01)
        finally:
            await asyncio.wait_for(manager.stop(), timeout=10)
            await store.aclose()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]
    assert manager.checkpoint_failures <= 8  # attempts: backoff from 0.1 s doubling, not one per wakeup
