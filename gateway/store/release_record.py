"""What both stores share about model releases: the checks made before anything is touched (bad
arguments fail the same way, ValueError, everywhere) and the history cap.

A release is kept byte for byte as put (its JSON) and never changed. An activation history entry
is kept as given plus the generation it produced; the caller's `expected_generation + 1` is that
generation whenever the activation wins, so the entry is encoded before the store is asked and no
store re-encodes JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

# Activation history entries kept per model (the oldest are dropped beyond this).
HISTORY_CAP = 1000


@dataclass(frozen=True, slots=True)
class NewRelease:
    """A checked record for `release_put`: what the stores index, and the JSON they keep."""

    model: str
    version: str
    created_at: float
    blob: bytes


def _json(value: dict[str, Any], what: str) -> bytes:
    if not isinstance(value, dict):
        raise ValueError(f"a release {what} must be a JSON object, not {type(value).__name__}")
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as error:
        raise ValueError(f"a release {what} must be JSON: {error}") from error


def check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"a release's {what} must be a non-empty string, not {value!r}")
    return value


def check_put(record: dict[str, Any]) -> NewRelease:
    blob = _json(record, "record")
    created_at = record.get("created_at")
    if isinstance(created_at, bool) or not isinstance(created_at, int | float) or not math.isfinite(created_at):
        raise ValueError(f"a release's created_at must be a unix time, not {created_at!r}")
    return NewRelease(
        model=check_name(record.get("model"), "model"),
        version=check_name(record.get("version"), "version"),
        created_at=float(created_at),
        blob=blob,
    )


def check_generation(expected_generation: object) -> int:
    if isinstance(expected_generation, bool) or not isinstance(expected_generation, int) or expected_generation < 0:
        raise ValueError(f"an expected generation is an integer >= 0, not {expected_generation!r}")
    return expected_generation


def check_activation(model: str, version: str, expected_generation: int, entry: dict[str, Any]) -> bytes:
    """The history entry as stored if the activation wins (the entry plus its new generation)."""
    check_name(model, "model")
    check_name(version, "version")
    check_generation(expected_generation)
    _json(entry, "history entry")
    return orjson.dumps({**entry, "generation": expected_generation + 1})


def check_canary(model: str, canary: dict[str, Any] | None, expected_generation: int) -> bytes | None:
    """The canary's JSON as stored (kept byte for byte, like records), or None to clear it."""
    check_name(model, "model")
    check_generation(expected_generation)
    return None if canary is None else _json(canary, "canary")
