"""Reading a stored JSON object into a typed record: each field checked once, at the seam, so that
a malformed or foreign record fails here (ValueError naming the field) and not as a KeyError deep in
a consumer. Used by every record's `from_dict`.

The records themselves raise ValueError (they also read files and arguments); a store reads back
under `stored`, which turns it into StoreCorrupt: a typed error the HTTP layer answers and the
release watcher survives, where a bare ValueError was a 500 or a dead task."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from gateway.errors import StoreCorrupt


def text(raw: dict[str, Any], name: str, what: str, default: str | None = None) -> str:
    value = raw.get(name, default)
    if not isinstance(value, str):
        raise ValueError(f"{what}'s {name} must be a string, not {value!r}")
    return value


def optional_text(raw: dict[str, Any], name: str, what: str) -> str | None:
    value = raw.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what}'s {name} must be a string or null, not {value!r}")
    return value


def number(raw: dict[str, Any], name: str, what: str, default: float | None = None) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what}'s {name} must be a finite number, not {value!r}")
    return value


def optional_number(raw: dict[str, Any], name: str, what: str) -> float | None:
    return None if raw.get(name) is None else number(raw, name, what)


def json_object(raw: object, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a JSON object, not {type(raw).__name__}")
    return raw


def without_none(values: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """`values` but the optional fields among `names` that are not set: they are absent from the
    stored JSON rather than null, as before records were typed."""
    return {k: v for k, v in values.items() if not (v is None and k in names)}


def integer(raw: dict[str, Any], name: str, what: str, default: int | None = None) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what}'s {name} must be an integer, not {value!r}")
    return value


def names(raw: dict[str, Any], name: str, what: str) -> tuple[str, ...]:
    value = raw.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what}'s {name} must be a list of names, not {value!r}")
    return tuple(value)


@contextlib.contextmanager
def stored(what: str, key: str) -> Iterator[None]:
    """Decoding a record read back from the store: a malformed one is StoreCorrupt naming it."""
    try:
        yield
    except ValueError as error:  # orjson's JSONDecodeError is one too
        raise StoreCorrupt(what, key, str(error)) from None
