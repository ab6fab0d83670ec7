"""The typed session state: it serializes to the JSON the stores kept before records were typed
(so a session checkpointed by an older replica still resumes), and a malformed stored state fails
at the seam, naming the field."""

from __future__ import annotations

import orjson
import pytest

from gateway.store.session_record import CHAT_COMPLETIONS, QuotaHold, SessionState
from gateway.surfaces.chat_completions import ChatCompletions

HOLD = {"tenant": "acme", "scopes": ["key:k1", "tenant"], "lease_id": "l1", "tokens": 40, "second": 17, "day": 20_000}
# As SessionManager wrote a streaming session's state before records were typed, in that key order.
STORED = {
    "request_id": "req-1",
    "quota": HOLD,
    "model": "m1",
    "body": {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    "completion_id": "chatcmpl-1",
    "created": 1_700_000_000,
    "include_usage": False,
    "key_id": "k1",
    "shared": False,
    "status": "streaming",
    "owner": "replica-a",
    "release": None,
    "deployments": ["d1", "d2"],
    "transcript": [{"role": "user", "content": "hi"}],
}


def test_a_session_state_serializes_to_the_json_stored_before_records_were_typed() -> None:
    state = SessionState.from_json(orjson.dumps(STORED))
    assert state.quota == QuotaHold("acme", ("key:k1", "tenant"), "l1", 40, 17, 20_000)
    assert state.to_json() == orjson.dumps(STORED)


def test_a_finished_state_without_transcript_or_body_keeps_them_absent() -> None:
    done = {k: v for k, v in STORED.items() if k not in ("body", "transcript")} | {"status": "done"}
    state = SessionState.from_dict(done)
    assert (state.body, state.transcript) == (None, None)
    assert state.to_dict() == done


def test_a_state_names_its_surface_unless_it_is_chat_completions() -> None:
    """A chat completions state is stored as before surfaces had names; any other names its own,
    so that a replica resuming it frames its events in that surface's form."""
    assert SessionState.from_dict(STORED).surface == ChatCompletions.name == CHAT_COMPLETIONS
    other = SessionState.from_dict(STORED | {"surface": "responses"})
    assert other.surface == "responses"
    assert other.to_dict() == STORED | {"surface": "responses"}


@pytest.mark.parametrize(
    ("field", "value"), [("status", None), ("key_id", 7), ("deployments", "d1"), ("quota", {"tenant": "acme"})]
)
def test_a_malformed_stored_state_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match="scopes" if field == "quota" else field):
        SessionState.from_json(orjson.dumps({**STORED, field: value}))
