"""The release watcher survives what it reads: a malformed record, a bug in a poll."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from gateway.releases.active import ActiveReleases
from gateway.releases.service import ReleaseService
from gateway.releases.watchers import ReleaseWatcher
from gateway.settings import EmbeddedStoreSettings
from gateway.store.embedded import DB_FILE, EmbeddedStore
from tests.store.helpers import entry, release

INTERVAL_S = 0.01


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "data"))
    yield store
    await store.aclose()


def _service(store: EmbeddedStore) -> ReleaseService:
    # The watcher only refreshes and advances canaries: no audit, router or health is reached.
    unused = cast(Any, None)
    return ReleaseService(store, unused, unused, unused, None, ActiveReleases())


async def _promote(store: EmbeddedStore, model: str, version: str) -> None:
    _, generation = await store.release_active(model)
    assert await store.release_activate(model, version, generation, entry(to=version)) == (True, generation + 1)


def _write_raw(tmp_path: Path, sql: str, *args: object) -> None:
    db = sqlite3.connect(tmp_path / "data" / DB_FILE)
    with db:
        db.execute(sql, args)
    db.close()


async def test_a_malformed_release_keeps_its_model_on_the_last_release_while_others_follow(
    store: EmbeddedStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for model in ("m1", "m2"):
        for version in ("v1", "v2"):
            assert await store.release_put(release(version, model=model))
        await _promote(store, model, "v1")
    service = _service(store)
    corrupt: list[str] = []
    watcher = ReleaseWatcher(store, service, INTERVAL_S, on_corrupt=corrupt.append)
    records = service.switchboard.active.records
    await watcher.poll()
    assert {m: r.version for m, r in records.items()} == {"m1": "v1", "m2": "v1"}

    _write_raw(tmp_path, "UPDATE releases SET record = ? WHERE model = 'm1' AND version = 'v2'", b'{"oops"')
    await _promote(store, "m1", "v2")
    await _promote(store, "m2", "v2")
    await watcher.poll()
    await watcher.poll()
    assert {m: r.version for m, r in records.items()} == {"m1": "v1", "m2": "v2"}
    assert corrupt == ["m1"]
    # Logged once for the record, not once per poll.
    assert sum("model m1 keeps release v1" in r.getMessage() for r in caplog.records) == 1

    good = orjson.dumps(release("v2", model="m1").to_dict())
    _write_raw(tmp_path, "UPDATE releases SET record = ? WHERE model = 'm1' AND version = 'v2'", good)
    await watcher.poll()
    assert records["m1"].version == "v2"
    assert corrupt == ["m1"]


async def test_an_unexpected_error_in_a_poll_is_logged_and_the_watcher_polls_again(
    store: EmbeddedStore, caplog: pytest.LogCaptureFixture
) -> None:
    assert await store.release_put(release("v1"))
    await _promote(store, "m1", "v1")
    service = _service(store)
    watcher = ReleaseWatcher(store, service, INTERVAL_S)
    polls = 0
    polled_again = asyncio.Event()

    async def failing_once() -> dict[str, int]:
        nonlocal polls
        polls += 1
        if polls == 1:
            raise RuntimeError("a bug in a poll")
        polled_again.set()
        return await EmbeddedStore.release_generations(store)

    store.release_generations = failing_once  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        task = asyncio.create_task(watcher.run())
        try:
            await asyncio.wait_for(polled_again.wait(), timeout=10)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert any(r.exc_info and "a bug in a poll" in str(r.exc_info[1]) for r in caplog.records)
