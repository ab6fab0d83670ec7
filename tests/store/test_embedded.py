"""The embedded store beyond the shared contract: windows under a moving clock, and one SQLite
file shared with another process."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from gateway.core.principal import Limits
from gateway.errors import StoreCorrupt, StoreUnavailable
from gateway.settings import EmbeddedStoreSettings
from gateway.store.base import WINDOW_S, AuditHead, QuotaScope
from gateway.store.embedded import DB_FILE, EmbeddedStore
from gateway.store.release_record import Canary, HistoryEntry, Release
from tests.store.helpers import admit_request, chained, key_record, key_scope
from tests.store.test_release_record import OLDEST_RELEASE, STORED_CANARY, STORED_ENTRY

MIDNIGHT = 20_000 * 86_400.0  # a UTC midnight


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(MIDNIGHT + 3600.0)


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> EmbeddedStore:
    return EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "data"), clock=clock)


async def test_the_rpm_window_frees_a_request_when_its_second_leaves_the_window(
    store: EmbeddedStore, clock: Clock
) -> None:
    scope, start = key_scope(rpm=2), clock.now
    assert (await store.admit(admit_request(scope))).admitted
    clock.now = start + 10.5
    assert (await store.admit(admit_request(scope))).admitted
    clock.now = start + 20
    denied = await store.admit(admit_request(scope))
    assert denied.retry_after_s == pytest.approx(WINDOW_S - 20)
    assert denied.usage["key:k1"].requests_reset_s == pytest.approx(WINDOW_S - 20 + 10)
    clock.now = start + WINDOW_S - 0.1
    assert not (await store.admit(admit_request(scope))).admitted
    clock.now = start + WINDOW_S
    assert (await store.admit(admit_request(scope))).admitted


async def test_tpm_retry_after_waits_for_as_many_old_buckets_as_needed(store: EmbeddedStore, clock: Clock) -> None:
    scope, start = key_scope(tpm=100), clock.now
    for offset, tokens in ((0, 30), (1, 30), (2, 40)):
        clock.now = start + offset
        assert (await store.admit(admit_request(scope, tokens=tokens))).admitted
    clock.now = start + 3
    denied = await store.admit(admit_request(scope, tokens=50))
    assert denied.retry_after_s == pytest.approx(1 + WINDOW_S - 3)  # the first two buckets must go
    clock.now = start + 1 + WINDOW_S
    assert (await store.admit(admit_request(scope, tokens=50))).admitted


async def test_a_rate_limit_retry_is_never_sooner_than_a_second(store: EmbeddedStore, clock: Clock) -> None:
    scope = key_scope(rpm=1)
    assert (await store.admit(admit_request(scope))).admitted
    clock.now += WINDOW_S - 0.5
    assert (await store.admit(admit_request(scope))).retry_after_s == 1.0


async def test_the_daily_budget_resets_at_utc_midnight(store: EmbeddedStore, clock: Clock) -> None:
    scope = key_scope(daily_tokens=100)
    clock.now = MIDNIGHT + 86_400 - 10
    assert (await store.admit(admit_request(scope, tokens=100))).admitted
    denied = await store.admit(admit_request(scope, tokens=1))
    assert denied.denied_limit == "daily_tokens"
    assert denied.retry_after_s == pytest.approx(10)
    clock.now = MIDNIGHT + 86_400
    assert (await store.admit(admit_request(scope, tokens=100))).admitted


async def test_settling_after_midnight_corrects_yesterdays_counter_only(store: EmbeddedStore, clock: Clock) -> None:
    scope = key_scope(daily_tokens=100)
    clock.now = MIDNIGHT - 5
    held = await store.admit(admit_request(scope, tokens=100))
    assert held.reservation is not None
    clock.now = MIDNIGHT + 5
    assert (await store.admit(admit_request(scope, tokens=60))).admitted
    await store.settle("acme", (scope,), held.reservation, used_tokens=0)
    assert not (await store.admit(admit_request(scope, tokens=41))).admitted
    assert (await store.admit(admit_request(scope, tokens=40))).admitted


async def test_settling_a_bucket_that_left_the_window_changes_nothing(store: EmbeddedStore, clock: Clock) -> None:
    scope = key_scope(tpm=100)
    held = await store.admit(admit_request(scope, tokens=10))
    assert held.reservation is not None
    clock.now += WINDOW_S + 1
    assert (await store.admit(admit_request(scope, tokens=60))).admitted
    await store.settle("acme", (scope,), held.reservation, used_tokens=1000)
    result = await store.admit(admit_request(scope, tokens=40))
    assert result.admitted


async def test_a_lease_expires_by_the_clock(store: EmbeddedStore, clock: Clock) -> None:
    scope = QuotaScope("tenant", Limits(max_concurrency=1))
    assert (await store.admit(admit_request(scope, ttl=30))).admitted
    clock.now += 29.9
    assert not (await store.admit(admit_request(scope))).admitted
    clock.now += 0.1
    assert (await store.admit(admit_request(scope))).admitted


async def test_another_process_sees_and_is_seen_through_the_same_file(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    await store.put_key(key_record("k1"))
    records = chained(AuditHead(0, ""), 1)
    assert await store.audit_append(AuditHead(0, ""), records)
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from gateway.settings import EmbeddedStoreSettings
        from gateway.store.base import AuditHead
        from gateway.store.embedded import EmbeddedStore
        from tests.store.helpers import chained, key_record

        async def main():
            store = EmbeddedStore(EmbeddedStoreSettings(path=Path({str(tmp_path)!r})))
            assert (await store.get_key("k1")) is not None
            await store.put_key(key_record("k2"))
            assert not await store.audit_append(AuditHead(0, ""), chained(AuditHead(0, ""), 1))
            head = await store.audit_head()
            assert await store.audit_append(head, chained(head, 1, writer="cli"))
            await store.aclose()

        asyncio.run(main())
        """
    )
    cli = await asyncio.create_subprocess_exec(sys.executable, "-c", script, cwd=Path(__file__).parents[2])
    assert await asyncio.wait_for(cli.wait(), timeout=30) == 0
    assert [r.id for r in await store.list_keys("acme")] == ["k1", "k2"]
    assert [r.body["writer"] for r in await store.audit_range(1, 10)] == ["w", "cli"]
    await store.aclose()


async def test_the_data_directory_is_created(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "a" / "b"))
    await store.ping()
    assert (tmp_path / "a" / "b" / "gateway.db").is_file()
    await store.aclose()


async def test_an_unusable_path_raises_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "file"))
    with pytest.raises(StoreUnavailable):
        await store.ping()
    with pytest.raises(StoreUnavailable):
        await store.get_key("k1")


async def test_a_closed_store_raises_store_unavailable(store: EmbeddedStore) -> None:
    await store.ping()
    await store.aclose()
    with pytest.raises(StoreUnavailable):
        await store.audit_head()


async def test_releases_canaries_and_history_written_before_records_were_typed_read_back(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "data"))
    assert await store.release_generations() == {}  # the schema exists
    with sqlite3.connect(tmp_path / "data" / DB_FILE) as db:
        db.execute("INSERT INTO releases VALUES ('m1', 'v2', 1.0, ?)", (orjson.dumps(OLDEST_RELEASE),))
        db.execute("INSERT INTO release_canary VALUES ('m1', ?)", (orjson.dumps(STORED_CANARY),))
        db.execute("INSERT INTO release_history VALUES ('m1', 1, ?)", (orjson.dumps(STORED_ENTRY),))
    db.close()
    try:
        assert await store.release_get("m1", "v2") == Release.from_dict(OLDEST_RELEASE)
        assert await store.release_list("m1") == [Release.from_dict(OLDEST_RELEASE)]
        assert await store.release_canary("m1") == Canary.from_dict(STORED_CANARY)
        assert await store.release_history("m1", 10) == [HistoryEntry.from_dict(STORED_ENTRY)]
    finally:
        await store.aclose()


async def test_a_malformed_release_or_canary_reads_back_as_store_corrupt_naming_it(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "data"))
    assert await store.release_generations() == {}  # the schema exists
    with sqlite3.connect(tmp_path / "data" / DB_FILE) as db:
        db.execute("INSERT INTO releases VALUES ('m1', 'v2', 1.0, ?)", (b'{"model": "m1", "secret": 7',))
        db.execute("INSERT INTO release_canary VALUES ('m1', ?)", (orjson.dumps({"version": 42}),))
        db.execute("INSERT INTO release_history VALUES ('m1', 1, ?)", (b"[]",))
    db.close()
    try:
        for read, key in [
            (store.release_get("m1", "v2"), "m1@v2"),
            (store.release_list("m1"), "m1@v2"),
            (store.release_canary("m1"), "m1"),
            (store.release_history("m1", 10), "m1"),
        ]:
            with pytest.raises(StoreCorrupt) as caught:
                await read
            assert caught.value.key == key
            assert "secret" not in caught.value.public_message
    finally:
        await store.aclose()


async def test_a_malformed_api_key_reads_back_as_store_corrupt_naming_it(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "data"))
    good = key_record("k1")
    await store.put_key(good)
    await store.put_key(key_record("k2"))
    with sqlite3.connect(tmp_path / "data" / DB_FILE) as db:
        # Limits(**raw) raised TypeError here, a 500 with a traceback on the auth path.
        bad = orjson.dumps({**good.to_dict(), "id": "k2", "limits": {"rpm": 1, "secret": 7}})
        db.execute("UPDATE api_keys SET record = ? WHERE id = 'k2'", (orjson.dumps({"secret": 7})[:-1],))
    db.close()
    try:
        digest = key_record("k2").digest
        for read, key in [
            (store.get_key("k2"), "k2"),
            (store.find_key(digest), f"with digest {digest[:12]}"),
            (store.list_keys(None), "k2"),
            (store.list_keys("acme"), "k2"),
        ]:
            with pytest.raises(StoreCorrupt) as caught:
                await read
            assert caught.value.key == key
            assert "secret" not in caught.value.public_message
        assert await store.get_key("k1") == good
        with sqlite3.connect(tmp_path / "data" / DB_FILE) as db:
            db.execute("UPDATE api_keys SET record = ? WHERE id = 'k2'", (bad,))
        db.close()
        assert (await store.get_key("k2")) is not None  # an unknown limit is ignored, not corrupt
        with sqlite3.connect(tmp_path / "data" / DB_FILE) as db:
            db.execute(
                "UPDATE api_keys SET record = ? WHERE id = 'k2'", (orjson.dumps({**good.to_dict(), "limits": 3}),)
            )
        db.close()
        with pytest.raises(StoreCorrupt):
            await store.get_key("k2")
    finally:
        await store.aclose()
