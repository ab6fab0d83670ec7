"""The typed approval record: it serializes to the JSON the stores kept before records were typed
(so existing data still loads, and what is written reads the same), and a malformed stored record
fails at the seam, naming the field."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import StoreCorrupt
from gateway.store import approval_record
from gateway.store.approval_record import Approval, Decision

# As ApprovalService wrote a wait-mode approval before records were typed, in that key order.
STORED = {
    "id": "appr_1",
    "tenant": "acme",
    "key_id": "k1",
    "session_id": None,
    "call_id": "call_1",
    "tool": "refund",
    "arguments": '{"amount": 10}',
    "arguments_sha256": "ab" * 32,
    "reason": "'refund' is a high-risk tool",
    "mode": "wait",
    "requested_at": 1000.5,
    "expires_at": 1300.5,
    "status": "pending",
    "conversation_sha256": "cd" * 32,
    "excerpt": [{"role": "user", "content": "refund it"}],
    "policy": "support",
    "risk": "high",
    "channel": "chat",
    "wait_deadline": 1030.5,
}
DECIDED = {"status": "approved", "decided_by": "k2", "decided_at": 1010.0, "decision_reason": "ok", "token": "t"}


def test_an_approval_serializes_to_the_json_stored_before_records_were_typed() -> None:
    record = Approval.from_dict(STORED)
    assert record.excerpt[0].content == "refund it"
    assert orjson.dumps(record.to_dict()) == orjson.dumps(STORED)


def test_a_decided_approval_reads_back_as_the_record_with_its_decision_merged() -> None:
    read = approval_record.read(orjson.dumps(STORED), orjson.dumps(DECIDED), approval_record.DECIDED, "ap1")
    assert read.to_dict() == {**STORED, **DECIDED}
    decision = Decision("approved", decided_by="k2", decided_at=1010.0, decision_reason="ok", token="t")
    assert read == Approval.from_dict(STORED).decided(decision)


def test_unset_optional_fields_are_absent_from_the_json_not_null() -> None:
    defer = {k: v for k, v in STORED.items() if k != "wait_deadline"}
    assert "wait_deadline" not in Approval.from_dict(defer).to_dict()
    assert Decision("rejected", decided_by="k2").to_dict() == {"status": "rejected", "decided_by": "k2"}


def test_an_approval_stored_before_excerpts_and_channels_reads_with_defaults() -> None:
    old = {k: v for k, v in STORED.items() if k not in ("conversation_sha256", "excerpt", "policy", "risk", "channel")}
    record = Approval.from_dict(old)
    assert (record.channel, record.excerpt, record.conversation_sha256) == ("chat", (), None)


@pytest.mark.parametrize(("field", "value"), [("tenant", None), ("expires_at", "soon"), ("excerpt", "text")])
def test_a_malformed_stored_approval_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(StoreCorrupt, match=field) as caught:
        approval_record.read(orjson.dumps({**STORED, field: value}), None, approval_record.PENDING, "ap1")
    assert caught.value.key == "ap1"
