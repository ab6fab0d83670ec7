"""Embedded approvals beyond the shared contract: expiry by the injected clock to the edge,
durability across a restart, forgotten rows purged by later puts, and a decision raced from
another process on the same file."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.settings import EmbeddedStoreSettings
from gateway.store.approval_record import Decision
from gateway.store.embedded import EmbeddedStore
from tests.store.helpers import approval_record
from tests.store.test_embedded import Clock

START = 1_700_000_000.0
APPROVE = Decision("approved", decided_by="alice")


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def settings(tmp_path: Path) -> EmbeddedStoreSettings:
    return EmbeddedStoreSettings(path=tmp_path / "data")


@pytest.fixture
def store(settings: EmbeddedStoreSettings, clock: Clock) -> EmbeddedStore:
    return EmbeddedStore(settings, clock=clock)


def rows(store: EmbeddedStore) -> int:
    with sqlite3.connect(store.path) as db:
        return int(db.execute("SELECT COUNT(*) FROM approvals").fetchone()[0])


async def test_an_approval_expires_exactly_at_its_expires_at(store: EmbeddedStore, clock: Clock) -> None:
    record = approval_record("a1", requested_at=START)  # expires at START + 60
    await store.approval_put(record, 100)
    clock.now = START + 60 - 0.001
    assert getattr(await store.approval_get("acme", "a1"), "status", None) == "pending"
    clock.now = START + 60
    assert getattr(await store.approval_get("acme", "a1"), "status", None) == "expired"
    assert await store.approval_decide("acme", "a1", APPROVE) == (False, dataclasses.replace(record, status="expired"))
    clock.now = START + 60 - 0.001  # nothing was written when it lapsed
    assert (await store.approval_decide("acme", "a1", APPROVE))[0]


async def test_an_approval_is_forgotten_exactly_its_retention_after_expiry(store: EmbeddedStore, clock: Clock) -> None:
    await store.approval_put(approval_record("a1", requested_at=START), 100)
    clock.now = START + 160 - 0.001
    assert await store.approval_get("acme", "a1") is not None
    clock.now = START + 160
    assert await store.approval_get("acme", "a1") is None
    assert await store.approval_list(None, None, 10) == []


async def test_forgotten_rows_are_purged_by_a_later_put(store: EmbeddedStore, clock: Clock) -> None:
    for i in range(5):
        await store.approval_put(approval_record(f"a{i}", requested_at=START), 10)
    assert rows(store) == 5
    clock.now = START + 1000
    await store.approval_get("acme", "a0")  # reads never purge
    assert rows(store) == 5
    await store.approval_put(approval_record("new", requested_at=clock.now), 10)
    assert rows(store) == 1


async def test_approvals_survive_a_restart(settings: EmbeddedStoreSettings, clock: Clock) -> None:
    first = EmbeddedStore(settings, clock=clock)
    await first.approval_put(approval_record("a1", requested_at=START), 100)
    won, decided = await first.approval_decide("acme", "a1", APPROVE)
    assert won
    await first.aclose()
    second = EmbeddedStore(settings, clock=clock)
    assert await second.approval_get("acme", "a1") == decided
    await second.aclose()


async def test_a_decision_raced_from_another_process_wins_once(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    await store.approval_put(approval_record("a1"), 100)
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from gateway.settings import EmbeddedStoreSettings
        from gateway.store.approval_record import Decision
        from gateway.store.embedded import EmbeddedStore

        async def main():
            store = EmbeddedStore(EmbeddedStoreSettings(path=Path({str(tmp_path)!r})))
            decide = lambda i: store.approval_decide("acme", "a1", Decision("approved", decided_by=f"cli-{{i}}"))
            results = await asyncio.gather(*(decide(i) for i in range(20)))
            print(sum(won for won, _ in results))
            await store.aclose()

        asyncio.run(main())
        """
    )
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, cwd=Path(__file__).parents[2], stdout=asyncio.subprocess.PIPE
    )
    ours = [store.approval_decide("acme", "a1", Decision("rejected", decided_by=f"server-{i}")) for i in range(20)]
    results, (out, _) = await asyncio.gather(asyncio.gather(*ours), asyncio.wait_for(cli.communicate(), timeout=30))
    assert cli.returncode == 0
    assert sum(won for won, _ in results) + int(out) == 1
    stored = await store.approval_get("acme", "a1")
    assert stored is not None
    assert stored.status in ("approved", "rejected")
    await store.aclose()
