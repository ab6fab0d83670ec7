"""The model-release part of the Store contract, run against both implementations (see
conftest.backing)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from gateway.store import release_record, sqlite_releases
from gateway.store.base import Store
from gateway.store.release_record import HistoryEntry
from tests.store.conftest import Backing
from tests.store.helpers import canary, entry, release


def stored(given: HistoryEntry, generation: int) -> HistoryEntry:
    """The entry as the history reads it back: as given, with the generation it produced."""
    return dataclasses.replace(given, generation=generation)


# --- put, get, list -----------------------------------------------------------------------


async def test_a_put_release_reads_back_field_for_field(store: Store) -> None:
    record = release("v1")
    assert await store.release_put(record) is True
    assert await store.release_get("m1", "v1") == record
    assert await store.release_get("m1", "v2") is None
    assert await store.release_get("m2", "v1") is None


async def test_releases_are_immutable(store: Store) -> None:
    record = release("v1")
    assert await store.release_put(record)
    assert await store.release_put(dataclasses.replace(record, notes="other", created_at=1.0)) is False
    assert await store.release_get("m1", "v1") == record
    assert await store.release_list("m1") == [record]


async def test_releases_list_oldest_first_then_by_version(store: Store) -> None:
    late = release("v0", created_at=3000.0)
    b = release("b", created_at=2000.0)
    a = release("a", created_at=2000.0)
    first = release("z", created_at=1000.5)
    odd = release("v 1/é:}{%", created_at=2500.0)
    for record in (late, b, odd, a, first, release("v1", model="m2")):
        assert await store.release_put(record)
    assert await store.release_list("m1") == [first, a, b, odd, late]
    assert await store.release_list("m3") == []


async def test_models_and_versions_cannot_run_into_each_other(store: Store) -> None:
    one, two = release("c", model="a:b"), release("b:c", model="a")
    for record in (one, two):
        assert await store.release_put(record)
    assert await store.release_get("a:b", "c") == one
    assert await store.release_get("a", "b:c") == two
    assert await store.release_list("a") == [two]
    assert await store.release_list("a:b") == [one]


@pytest.mark.parametrize(
    "bad",
    [
        {"model": None},
        {"model": ""},
        {"version": 3},
        {"created_at": None},
        {"created_at": True},
        {"created_at": float("nan")},
        {"notes": object()},
    ],
)
async def test_a_bad_release_is_refused_before_anything_is_written(store: Store, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"release|generation"):
        await store.release_put(dataclasses.replace(release("v1"), **bad))
    assert await store.release_list("m1") == []


# --- activation ---------------------------------------------------------------------------


async def test_nothing_is_active_before_the_first_activation(store: Store) -> None:
    assert await store.release_active("m1") == (None, 0)
    assert await store.release_history("m1", 10) == []
    assert await store.release_generations() == {}


async def test_activation_with_the_current_generation_wins_and_bumps_it(store: Store) -> None:
    for version in ("v1", "v2"):
        await store.release_put(release(version))
    assert await store.release_activate("m1", "v1", 0, entry(to="v1")) == (True, 1)
    assert await store.release_active("m1") == ("v1", 1)
    assert await store.release_activate("m1", "v2", 1, entry(to="v2", frm="v1")) == (True, 2)
    assert await store.release_active("m1") == ("v2", 2)
    # Back to an earlier release: still a new generation.
    assert await store.release_activate("m1", "v1", 2, entry(to="v1", frm="v2")) == (True, 3)
    assert await store.release_active("m1") == ("v1", 3)


async def test_activation_with_a_stale_generation_changes_nothing(store: Store) -> None:
    for version in ("v1", "v2"):
        await store.release_put(release(version))
    assert await store.release_activate("m1", "v1", 0, entry()) == (True, 1)
    assert await store.release_activate("m1", "v2", 0, entry(to="v2")) == (False, 1)
    assert await store.release_activate("m1", "v2", 5, entry(to="v2")) == (False, 1)
    assert await store.release_active("m1") == ("v1", 1)
    assert len(await store.release_history("m1", 10)) == 1


async def test_activating_an_unknown_release_changes_nothing(store: Store) -> None:
    await store.release_put(release("v1"))
    await store.release_put(release("v9", model="m2"))
    assert await store.release_activate("m1", "v9", 0, entry(to="v9")) == (False, 0)
    assert await store.release_active("m1") == (None, 0)
    assert await store.release_activate("m1", "v1", 0, entry()) == (True, 1)
    assert await store.release_activate("m1", "nope", 1, entry(to="nope")) == (False, 1)
    assert await store.release_active("m1") == ("v1", 1)
    assert await store.release_history("m1", 10) == [stored(entry(), 1)]
    assert await store.release_generations() == {"m1": 1}


async def test_of_concurrent_activations_exactly_one_wins(store: Store) -> None:
    versions = [f"v{i}" for i in range(20)]
    for version in versions:
        await store.release_put(release(version))
    calls = [store.release_activate("m1", v, 0, entry(by=f"u{i}", to=v)) for i, v in enumerate(versions)]
    results = await asyncio.gather(*calls)
    assert sorted(results) == [(False, 1)] * 19 + [(True, 1)]
    winner = versions[results.index((True, 1))]
    assert await store.release_active("m1") == (winner, 1)
    assert await store.release_history("m1", 100) == [stored(entry(by=f"u{versions.index(winner)}", to=winner), 1)]


async def test_of_activations_from_two_clients_exactly_one_wins(backing: Backing, store: Store) -> None:
    other = backing.open()  # another replica (Redis) or another process's connection (SQLite file)
    versions = [f"v{i}" for i in range(20)]
    for version in versions:
        await store.release_put(release(version))
    await store.release_activate("m1", "v0", 0, entry(to="v0"))
    calls = [(store, other)[i % 2].release_activate("m1", v, 1, entry(to=v)) for i, v in enumerate(versions)]
    results = await asyncio.gather(*calls)
    assert sorted(results) == [(False, 2)] * 19 + [(True, 2)]
    winner = versions[results.index((True, 2))]
    assert await other.release_active("m1") == (winner, 2)
    assert await store.release_active("m1") == (winner, 2)


async def test_history_is_newest_first_with_generations(store: Store) -> None:
    for version in ("v1", "v2", "v3"):
        await store.release_put(release(version))
    steps = [("v1", None), ("v2", "v1"), ("v3", "v2"), ("v1", "v3")]
    for generation, (to, frm) in enumerate(steps):
        assert await store.release_activate("m1", to, generation, entry(to=to, frm=frm)) == (True, generation + 1)
    expected = [stored(entry(to=to, frm=frm), g + 1) for g, (to, frm) in enumerate(steps)][::-1]
    assert await store.release_history("m1", 10) == expected
    assert await store.release_history("m1", 2) == expected[:2]
    assert await store.release_history("m1", 0) == []
    assert await store.release_history("m2", 10) == []


async def test_generations_cover_every_activated_model(store: Store) -> None:
    for model in ("m1", "m:2", "m3"):
        await store.release_put(release("v1", model=model))
        await store.release_put(release("v2", model=model))
    await store.release_activate("m1", "v1", 0, entry())
    await store.release_activate("m1", "v2", 1, entry(to="v2"))
    await store.release_activate("m:2", "v1", 0, entry())
    assert await store.release_generations() == {"m1": 2, "m:2": 1}
    assert await store.release_active("m3") == (None, 0)


@pytest.mark.parametrize("expected", [-1, True, 1.0])
async def test_a_bad_activation_is_refused_before_anything_is_written(store: Store, expected: Any) -> None:
    await store.release_put(release("v1"))
    with pytest.raises(ValueError, match=r"release|generation"):
        await store.release_activate("m1", "v1", expected, entry())
    with pytest.raises(ValueError, match=r"release|generation"):
        await store.release_activate("m1", "v1", 0, dataclasses.replace(entry(), reason=object()))  # type: ignore[arg-type]  # the wrong type on purpose
    assert await store.release_active("m1") == (None, 0)


async def test_history_keeps_only_the_newest_entries(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release_record, "HISTORY_CAP", 3)
    monkeypatch.setattr(sqlite_releases, "HISTORY_CAP", 3)
    for version in ("v1", "v2"):
        await store.release_put(release(version))
    for generation in range(5):
        to = ("v1", "v2")[generation % 2]
        assert await store.release_activate("m1", to, generation, entry(to=to)) == (True, generation + 1)
    assert [e.generation for e in await store.release_history("m1", 10)] == [5, 4, 3]


# --- canary -------------------------------------------------------------------------------


async def test_no_canary_before_one_is_set(store: Store) -> None:
    assert await store.release_canary("m1") is None


async def test_a_canary_reads_back_exactly_as_set_and_bumps_the_generation(store: Store) -> None:
    await store.release_put(release("v1"))
    assert await store.release_activate("m1", "v1", 0, entry()) == (True, 1)
    assert await store.release_set_canary("m1", canary(), 1) == (True, 2)
    assert await store.release_canary("m1") == canary()
    assert await store.release_canary("m2") is None
    assert await store.release_active("m1") == ("v1", 2)
    assert await store.release_generations() == {"m1": 2}
    # Replacing it is another set.
    assert await store.release_set_canary("m1", canary(share=0.25), 2) == (True, 3)
    assert await store.release_canary("m1") == canary(share=0.25)
    assert await store.release_active("m1") == ("v1", 3)
    # Canaries are not activations.
    assert await store.release_history("m1", 10) == [stored(entry(), 1)]


async def test_clearing_a_canary_with_none_bumps_the_generation(store: Store) -> None:
    await store.release_put(release("v1"))
    await store.release_activate("m1", "v1", 0, entry())
    assert await store.release_set_canary("m1", canary(), 1) == (True, 2)
    assert await store.release_set_canary("m1", None, 2) == (True, 3)
    assert await store.release_canary("m1") is None
    assert await store.release_active("m1") == ("v1", 3)
    assert await store.release_generations() == {"m1": 3}
    # Clearing when none is running still counts (the caller asked for a switch).
    assert await store.release_set_canary("m1", None, 3) == (True, 4)


async def test_a_canary_before_any_activation_starts_the_generation(store: Store) -> None:
    assert await store.release_set_canary("m1", canary(), 0) == (True, 1)
    assert await store.release_active("m1") == (None, 1)
    assert await store.release_canary("m1") == canary()
    assert await store.release_generations() == {"m1": 1}
    # Activation then compares against that generation.
    await store.release_put(release("v1"))
    assert await store.release_activate("m1", "v1", 0, entry()) == (False, 1)
    assert await store.release_activate("m1", "v1", 1, entry()) == (True, 2)
    assert await store.release_active("m1") == ("v1", 2)
    assert await store.release_history("m1", 10) == [stored(entry(), 2)]


async def test_a_canary_with_a_stale_generation_changes_nothing(store: Store) -> None:
    await store.release_put(release("v1"))
    await store.release_activate("m1", "v1", 0, entry())
    assert await store.release_set_canary("m1", canary(), 0) == (False, 1)
    assert await store.release_set_canary("m1", canary(), 7) == (False, 1)
    assert await store.release_canary("m1") is None
    assert await store.release_set_canary("m1", canary(), 1) == (True, 2)
    assert await store.release_set_canary("m1", None, 1) == (False, 2)
    assert await store.release_set_canary("m1", canary(share=0.5), 1) == (False, 2)
    assert await store.release_canary("m1") == canary()
    assert await store.release_active("m1") == ("v1", 2)
    assert await store.release_generations() == {"m1": 2}
    assert await store.release_set_canary("m2", canary(), 1) == (False, 0)
    assert await store.release_active("m2") == (None, 0)
    assert await store.release_generations() == {"m1": 2}


async def test_activation_ends_the_canary(store: Store) -> None:
    for version in ("v1", "v2"):
        await store.release_put(release(version))
        await store.release_put(release(version, model="m2"))
    await store.release_activate("m1", "v1", 0, entry())
    await store.release_activate("m2", "v1", 0, entry())
    assert await store.release_set_canary("m1", canary(), 1) == (True, 2)
    assert await store.release_set_canary("m2", canary(), 1) == (True, 2)
    # Promote m1's canary: the canary is gone, m2's is untouched.
    assert await store.release_activate("m1", "v2", 2, entry(to="v2", frm="v1")) == (True, 3)
    assert await store.release_canary("m1") is None
    assert await store.release_canary("m2") == canary()
    # A refused activation leaves the canary running.
    assert await store.release_activate("m2", "v2", 1, entry(to="v2")) == (False, 2)
    assert await store.release_canary("m2") == canary()
    # Rolling back (to the version already active) ends it too.
    assert await store.release_activate("m2", "v1", 2, entry(to="v1", frm="v1")) == (True, 3)
    assert await store.release_canary("m2") is None
    assert await store.release_generations() == {"m1": 3, "m2": 3}


async def test_of_concurrent_canary_sets_exactly_one_wins(store: Store) -> None:
    await store.release_put(release("v1"))
    await store.release_activate("m1", "v1", 0, entry())
    calls = [store.release_set_canary("m1", canary(share=i / 100), 1) for i in range(10)]
    results = await asyncio.gather(*calls)
    assert sorted(results) == [(False, 2)] * 9 + [(True, 2)]
    winner = results.index((True, 2))
    assert await store.release_canary("m1") == canary(share=winner / 100)
    assert await store.release_active("m1") == ("v1", 2)


async def test_of_canary_sets_from_two_clients_exactly_one_wins(backing: Backing, store: Store) -> None:
    other = backing.open()
    calls = [(store, other)[i % 2].release_set_canary("m1", canary(share=i / 100), 0) for i in range(10)]
    results = await asyncio.gather(*calls)
    assert sorted(results) == [(False, 1)] * 9 + [(True, 1)]
    winner = results.index((True, 1))
    assert await other.release_canary("m1") == canary(share=winner / 100)
    assert await store.release_generations() == {"m1": 1}


@pytest.mark.parametrize(
    ("model", "value", "expected"),
    [
        ("", canary(), 0),
        ("m1", canary(), -1),
        ("m1", canary(), True),
        ("m1", canary(), 1.0),
        ("m1", ["not", "an", "object"], 0),
        ("m1", dataclasses.replace(canary(), by=object()), 0),  # type: ignore[arg-type]  # the wrong type on purpose
    ],
)
async def test_a_bad_canary_is_refused_before_anything_is_written(
    store: Store, model: str, value: Any, expected: Any
) -> None:
    with pytest.raises(ValueError, match=r"release|generation|canary"):
        await store.release_set_canary(model, value, expected)
    assert await store.release_canary("m1") is None
    assert await store.release_generations() == {}
