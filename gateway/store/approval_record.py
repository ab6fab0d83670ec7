"""What both stores share about approvals: the checks made before anything is touched (bad
arguments fail the same way, ValueError, everywhere) and the one way a stored approval reads back.

A store keeps the record exactly as put and, once decided, the decision beside it; reading merges
the two (the decision's keys win). An undecided approval reads as "pending" until its expires_at,
then as "expired", without anything being written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

STATUSES = ("pending", "approved", "rejected", "expired")
DECISIONS = ("approved", "rejected", "expired")  # expired: by the gateway, when a wait ends
# A decision cannot change what identifies an approval or when it lapses.
FIXED_FIELDS = ("id", "tenant", "requested_at", "expires_at")

# How a store reports a stored approval's state to `read`.
DECIDED, PENDING, EXPIRED = "decided", "pending", "expired"


@dataclass(frozen=True, slots=True)
class NewApproval:
    """A checked record for `approval_put`: what the stores index, and the JSON they keep."""

    tenant: str
    id: str
    requested_at: float
    expires_at: float
    forget_at: float  # expires_at + the retention: from then on it does not exist
    blob: bytes


def _json(value: dict[str, Any], what: str) -> bytes:
    if not isinstance(value, dict):
        raise ValueError(f"an approval {what} must be a JSON object, not {type(value).__name__}")
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as error:
        raise ValueError(f"an approval {what} must be JSON: {error}") from error


def _time(record: dict[str, Any], name: str) -> float:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"an approval's {name} must be a unix time, not {value!r}")
    return float(value)


def _text(record: dict[str, Any], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"an approval's {name} must be a non-empty string, not {value!r}")
    return value


def check_put(record: dict[str, Any], ttl_s: float) -> NewApproval:
    blob = _json(record, "record")
    if record.get("status") != "pending":
        raise ValueError(f"a new approval's status must be 'pending', not {record.get('status')!r}")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not (ttl_s > 0 and math.isfinite(ttl_s)):
        raise ValueError(f"an approval's retention must be a positive number of seconds, not {ttl_s!r}")
    expires_at = _time(record, "expires_at")
    return NewApproval(
        tenant=_text(record, "tenant"),
        id=_text(record, "id"),
        requested_at=_time(record, "requested_at"),
        expires_at=expires_at,
        forget_at=expires_at + ttl_s,
        blob=blob,
    )


def check_decision(decision: dict[str, Any]) -> bytes:
    blob = _json(decision, "decision")
    if decision.get("status") not in DECISIONS:
        raise ValueError(f"a decision's status must be one of {', '.join(DECISIONS)}, not {decision.get('status')!r}")
    fixed = sorted(set(decision) & set(FIXED_FIELDS))
    if fixed:
        raise ValueError(f"a decision cannot change {', '.join(fixed)}")
    return blob


def check_status(status: str | None) -> None:
    if status is not None and status not in STATUSES:
        raise ValueError(f"an approval status is one of {', '.join(STATUSES)}, not {status!r}")


def read(record: bytes | str, decision: bytes | str | None, state: str) -> dict[str, Any]:
    """The approval as callers see it. `state`: DECIDED (then `decision` is its JSON), PENDING
    or EXPIRED (by the store's clock)."""
    approval: dict[str, Any] = orjson.loads(record)
    if state == DECIDED and decision:
        approval.update(orjson.loads(decision))
    elif state == EXPIRED:
        approval["status"] = "expired"
    return approval
