"""What both stores share about approvals: the checks made before anything is touched (bad
arguments fail the same way, ValueError, everywhere) and the one way a stored approval reads back.

`Approval` and `Decision` are the records that cross the seam; the JSON they serialize to is what the
stores keep (the same shape as before records were typed, so existing data still loads). A store
keeps the record exactly as put and, once decided, the decision beside it; reading merges
the two (the decision's keys win). An undecided approval reads as "pending" until its expires_at,
then as "expired", without anything being written.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

from gateway.store import fields

STATUSES = ("pending", "approved", "rejected", "expired")
DECISIONS = ("approved", "rejected", "expired")  # expired: by the gateway, when a wait ends

# How a store reports a stored approval's state to `read`.
DECIDED, PENDING, EXPIRED = "decided", "pending", "expired"


_WHAT = "an approval"
_DECISION_FIELDS = ("decided_by", "decided_at", "decision_reason", "token")


@dataclass(frozen=True, slots=True)
class ExcerptMessage:
    """One message of the conversation that led to the call, cut short, for the approver."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What a person (or the gateway, when a wait ends) decided; merged into the approval."""

    status: str  # one of DECISIONS
    decided_by: str | None = None
    decided_at: float | None = None
    decision_reason: str | None = None
    token: str | None = None  # approved calls only: what the released call carries

    def to_dict(self) -> dict[str, Any]:
        return fields.without_none(asdict(self), _DECISION_FIELDS)


@dataclass(frozen=True, slots=True)
class Approval:
    """A held tool call, as the gateway builds it and (with its decision merged in) reads it back.
    Fields after `channel` are absent from the JSON until set (the wait deadline: wait mode only;
    the decision's: once decided)."""

    id: str
    tenant: str
    key_id: str
    session_id: str | None
    call_id: str
    tool: str
    arguments: str
    arguments_sha256: str
    reason: str
    mode: str  # policies.ApprovalMode value
    requested_at: float
    expires_at: float
    status: str  # one of STATUSES
    # Approvals stored before these existed read with these defaults.
    conversation_sha256: str | None = None
    excerpt: tuple[ExcerptMessage, ...] = ()
    policy: str | None = None
    risk: str = ""
    channel: str = "chat"  # where the decided call goes: "chat" or "mcp"
    wait_deadline: float | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    decision_reason: str | None = None
    token: str | None = None

    def decided(self, decision: Decision) -> Approval:
        """This approval with `decision` merged in (its set fields win), as a store reads it back."""
        changes = {k: v for k, v in asdict(decision).items() if v is not None}
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        values = {**asdict(self), "excerpt": [asdict(m) for m in self.excerpt]}
        return fields.without_none(values, ("wait_deadline", *_DECISION_FIELDS))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Approval:
        """Checked field by field (ValueError naming the field); unknown fields are ignored."""
        excerpt = raw.get("excerpt") or []
        if not isinstance(excerpt, list):
            raise ValueError(f"an approval's excerpt must be a list, not {excerpt!r}")
        text, optional = fields.text, fields.optional_text
        return cls(
            id=text(raw, "id", _WHAT),
            tenant=text(raw, "tenant", _WHAT),
            key_id=text(raw, "key_id", _WHAT),
            session_id=optional(raw, "session_id", _WHAT),
            call_id=text(raw, "call_id", _WHAT),
            tool=text(raw, "tool", _WHAT),
            arguments=text(raw, "arguments", _WHAT),
            arguments_sha256=text(raw, "arguments_sha256", _WHAT),
            reason=text(raw, "reason", _WHAT),
            mode=text(raw, "mode", _WHAT),
            requested_at=fields.number(raw, "requested_at", _WHAT),
            expires_at=fields.number(raw, "expires_at", _WHAT),
            status=text(raw, "status", _WHAT),
            conversation_sha256=optional(raw, "conversation_sha256", _WHAT),
            excerpt=tuple(_excerpt_message(fields.json_object(m, "an excerpt message")) for m in excerpt),
            policy=optional(raw, "policy", _WHAT),
            risk=text(raw, "risk", _WHAT, ""),
            channel=text(raw, "channel", _WHAT, "chat"),
            wait_deadline=fields.optional_number(raw, "wait_deadline", _WHAT),
            decided_by=optional(raw, "decided_by", _WHAT),
            decided_at=fields.optional_number(raw, "decided_at", _WHAT),
            decision_reason=optional(raw, "decision_reason", _WHAT),
            token=optional(raw, "token", _WHAT),
        )


def _excerpt_message(raw: dict[str, Any]) -> ExcerptMessage:
    return ExcerptMessage(
        fields.text(raw, "role", "an excerpt message"), fields.text(raw, "content", "an excerpt message")
    )


@dataclass(frozen=True, slots=True)
class NewApproval:
    """A checked record for `approval_put`: what the stores index, and the JSON they keep."""

    tenant: str
    id: str
    key_id: str  # the key that asked: what `PendingCaps.per_key` counts by
    requested_at: float
    expires_at: float
    forget_at: float  # expires_at + the retention: from then on it does not exist
    blob: bytes


@dataclass(frozen=True, slots=True)
class PendingCaps:
    """How many approvals may be pending at once (undecided, not lapsed) for one key and for its
    whole tenant, for `approval_put_within`."""

    per_key: int
    per_tenant: int

    def __post_init__(self) -> None:
        for name in ("per_key", "per_tenant"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"a pending-approval cap ({name}) must be a positive integer, not {value!r}")


def _json(value: dict[str, Any], what: str) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as error:
        raise ValueError(f"an approval {what} must be JSON: {error}") from error


def _time(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"an approval's {name} must be a unix time, not {value!r}")
    return float(value)


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"an approval's {name} must be a non-empty string, not {value!r}")
    return value


def check_put(record: Approval, ttl_s: float) -> NewApproval:
    blob = _json(record.to_dict(), "record")
    if record.status != "pending":
        raise ValueError(f"a new approval's status must be 'pending', not {record.status!r}")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not (ttl_s > 0 and math.isfinite(ttl_s)):
        raise ValueError(f"an approval's retention must be a positive number of seconds, not {ttl_s!r}")
    expires_at = _time(record.expires_at, "expires_at")
    return NewApproval(
        tenant=_text(record.tenant, "tenant"),
        id=_text(record.id, "id"),
        key_id=_text(record.key_id, "key_id"),
        requested_at=_time(record.requested_at, "requested_at"),
        expires_at=expires_at,
        forget_at=expires_at + ttl_s,
        blob=blob,
    )


def check_decision(decision: Decision) -> bytes:
    if decision.status not in DECISIONS:
        raise ValueError(f"a decision's status must be one of {', '.join(DECISIONS)}, not {decision.status!r}")
    return _json(decision.to_dict(), "decision")


def check_status(status: str | None) -> None:
    if status is not None and status not in STATUSES:
        raise ValueError(f"an approval status is one of {', '.join(STATUSES)}, not {status!r}")


def read(record: bytes | str, decision: bytes | str | None, state: str, key: str) -> Approval:
    """The approval as callers see it. `state`: DECIDED (then `decision` is its JSON), PENDING
    or EXPIRED (by the store's clock). A malformed one is StoreCorrupt naming `key`."""
    with fields.stored("approval", key):
        approval = fields.json_object(orjson.loads(record), "a stored approval")
        if state == DECIDED and decision:
            approval.update(fields.json_object(orjson.loads(decision), "a stored decision"))
        elif state == EXPIRED:
            approval["status"] = "expired"
        return Approval.from_dict(approval)
