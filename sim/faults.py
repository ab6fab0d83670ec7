"""Fault injection settings for the simulated backend.

A `Faults` value describes how the sim misbehaves. The process-wide value comes from the profile
(and may be replaced at runtime through the control endpoint); a request can carry its own value in
the `X-Sim-Fault` header, which replaces the process faults for that one request.

Positional faults (`cut_after`, `stall_after`, `keepalive_after`, `inband_error_after`,
`malformed_after`) count emitted tokens: with `k` they fire at the moment token `k + 1` would have
been sent, so `k == 0` fires before any token and `k == n` (the reply length) fires after the last
token but before the finish chunk. A value larger than the reply length never fires.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from common.problems import key_path

FAULT_HEADER = "x-sim-fault"

_Count = Annotated[int, Field(ge=0)]


class FaultError(ValueError):
    """A fault specification that cannot be used; the message is safe to show to the client."""


class PositionalFault(Enum):
    """What a positional fault does once it fires."""

    ABORT = "cut"
    STALL = "stall"
    KEEPALIVE = "keepalive"  # SSE comments forever: alive on the wire, silent in the data
    INBAND_ERROR = "inband_error"
    MALFORMED = "malformed"


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Faults:
    """How the sim misbehaves; the default value is a healthy backend."""

    status: Annotated[int, Field(ge=400, le=599)] | None = None
    retry_after: Annotated[float, Field(ge=0)] | None = None
    cut_after: _Count | None = None
    stall_after: _Count | None = None
    slow: Annotated[float, Field(ge=0)] = 1.0
    error_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    inband_error_after: _Count | None = None
    malformed_after: _Count | None = None
    # Misreporting backends: `length` tokens whatever max_tokens says, `chunk_tokens` tokens in
    # each streamed event, and every usage figure reported as `usage` (0, -1, 1.5, 2**64, 1e308).
    length: Annotated[int, Field(ge=1)] | None = None
    chunk_tokens: Annotated[int, Field(ge=1)] = 1
    usage: int | float | None = None
    keepalive_after: _Count | None = None
    # /health and /v1/models start a 200 and never finish the body.
    drip_health: bool = False

    def first_positional(self) -> tuple[int, PositionalFault] | None:
        """The earliest positional fault; on a tie the harsher one wins (abort before stall...)."""
        candidates = [
            (self.cut_after, PositionalFault.ABORT),
            (self.stall_after, PositionalFault.STALL),
            (self.keepalive_after, PositionalFault.KEEPALIVE),
            (self.inband_error_after, PositionalFault.INBAND_ERROR),
            (self.malformed_after, PositionalFault.MALFORMED),
        ]
        present = [(k, cut) for k, cut in candidates if k is not None]
        if not present:
            return None
        return min(present, key=lambda item: item[0])

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FAULT_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(Faults))
# Fields that may be named alone (`drip_health`), meaning true.
_FLAG_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(Faults) if f.type in (bool, "bool"))


def parse_fault_fields(text: str) -> dict[str, str | None]:
    """Split `key=value,key=value` into raw strings; `none` (or an empty value) clears a field, and
    a flag named alone (`drip_health`) is set.

    The values stay strings so that they can be merged over other settings before validation.
    """
    fields: dict[str, str | None] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item or item.lower() == "none":
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep and key in _FLAG_FIELDS:
            sep, value = "=", "true"
        if not sep or key not in FAULT_FIELDS:
            raise FaultError(f"bad fault item {item!r}: expected key=value with key in {sorted(FAULT_FIELDS)}")
        value = value.strip()
        fields[key] = None if value.lower() in ("", "none", "null") else value
    return fields


def faults_from_mapping(fields: Mapping[str, Any]) -> Faults:
    """Validate a mapping of fault fields (strings are coerced) into `Faults`."""
    try:
        return Faults(**dict(fields))
    except ValidationError as exc:
        raise FaultError(_describe(exc)) from exc
    except TypeError as exc:
        # Non-string keys never reach pydantic's own check.
        raise FaultError(str(exc)) from exc


def parse_faults(text: str) -> Faults:
    """Parse the `X-Sim-Fault` header syntax, e.g. `status=429,retry_after=1` or `cut_after=5`."""
    return faults_from_mapping(parse_fault_fields(text))


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = key_path(error["loc"]) or "faults"
        parts.append(f"{where}: {error['msg']}")
    return "invalid faults: " + "; ".join(parts)
