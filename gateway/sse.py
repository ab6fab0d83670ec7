"""Server-sent events framing, shared by live responses and resumed ones."""

from __future__ import annotations

from typing import Any

import orjson

DONE_PAYLOAD = b"[DONE]"
DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return data(orjson.dumps(payload))


def data(payload: bytes) -> bytes:
    """An event of payload bytes already encoded."""
    return b"data: " + payload + b"\n\n"


def frame(seq: int, payload: bytes) -> bytes:
    """An event with its sequence number, for `Last-Event-ID` resume."""
    return b"id: %d\ndata: %s\n\n" % (seq, payload)
