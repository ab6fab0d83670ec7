"""Helpers for reading the sim's server-sent events in tests."""

from __future__ import annotations

from typing import Any

import orjson

from common.sse_reader import read_events

DONE = "[DONE]"


def sse_payloads(text: str) -> list[str]:
    """The data of each event of an SSE body, in order."""
    return [data.decode() for data, _, _ in read_events(text)]


def sse_events(text: str) -> list[Any]:
    """Decoded JSON events; `[DONE]` stays a string. Fails on a malformed event."""
    return [payload if payload == DONE else orjson.loads(payload) for payload in sse_payloads(text)]


def content_tokens(events: list[Any]) -> list[str]:
    """The content deltas of a decoded stream, one per token chunk (the role chunk's "" excluded)."""
    tokens = []
    for event in events:
        if not isinstance(event, dict) or not event.get("choices"):
            continue
        delta = event["choices"][0]["delta"]
        if "role" not in delta and isinstance(delta.get("content"), str):
            tokens.append(delta["content"])
    return tokens
