"""SSE framing for the APIs whose events name their type (Responses, Anthropic Messages): every
payload they write starts with `{"type":"<type>"`, which becomes the event's `event:` line."""

from __future__ import annotations

_TYPE_PREFIX = b'{"type":"'


def event_type(payload: bytes) -> bytes:
    """The payload's `type` (the writers put it first); `error` for anything else (an error body
    written outside the writer)."""
    if payload.startswith(_TYPE_PREFIX):
        end = payload.find(b'"', len(_TYPE_PREFIX))
        if end > 0:
            return payload[len(_TYPE_PREFIX) : end]
    return b"error"


def typed_frame(seq: int | None, payload: bytes) -> bytes:
    """One SSE event named by its type, with its id when it is a session log's."""
    kind = event_type(payload)
    if seq is None:
        return b"event: %s\ndata: %s\n\n" % (kind, payload)
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, kind, payload)
