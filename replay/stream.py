"""Interpreting an SSE chat-completions stream, event by event.

The events come from `common.sse_reader`, on raw bytes and per network read, so that every event
gets the arrival time of the read that delivered it; a broken event is seen as broken here
instead of being skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from common.sse_reader import is_done
from replay.record import INBAND_ERROR, MALFORMED_CHUNK

# The fallback token estimate when the server reports no usage: words and punctuation marks.
_TOKEN_ESTIMATE = re.compile(r"\w+|[^\w\s]")


def estimate_tokens(text: str) -> int:
    return len(_TOKEN_ESTIMATE.findall(text))


@dataclass(slots=True)
class StreamState:
    """What a stream has delivered so far; `failure` holds the first problem seen in-band."""

    event_times: list[float] = field(default_factory=list)
    output_times: list[float] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None
    usage_tokens: int | None = None
    tool_args: dict[int, list[str]] = field(default_factory=dict)
    failure: tuple[str, str] | None = None

    def on_event(self, name: bytes, data: bytes, now: float) -> None:
        self.event_times.append(now)
        if is_done(data):
            self.done = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.fail(MALFORMED_CHUNK, f"unparsable chunk: {data[:120]!r}")
            return
        if not isinstance(chunk, dict):
            self.fail(MALFORMED_CHUNK, f"chunk is not an object: {data[:120]!r}")
            return
        if "error" in chunk or name == b"error":
            self.fail(INBAND_ERROR, f"in-band error: {str(chunk.get('error', chunk))[:200]}")
            return
        self._usage(chunk.get("usage"))
        choices = chunk.get("choices")
        if isinstance(choices, list):
            carried = [self._choice(choice) for choice in choices if isinstance(choice, dict)]
            # Several choices in one chunk still arrived together: one output time per chunk.
            if any(carried):
                self.output_times.append(now)

    def fail(self, reason: str, detail: str) -> None:
        if self.failure is None:
            self.failure = (reason, detail)

    def _usage(self, usage: Any) -> None:
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]

    def _choice(self, choice: dict[str, Any]) -> bool:
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason
        delta = choice.get("delta")
        return isinstance(delta, dict) and self._carries_output(delta)

    def _carries_output(self, delta: dict[str, Any]) -> bool:
        """Content, reasoning or a tool-call delta; a role-only chunk carries nothing."""
        carried = False
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                carried = True
        calls = delta.get("tool_calls")
        if isinstance(calls, list) and calls:
            carried = True
            self._tool_deltas(calls)
        return carried

    def _tool_deltas(self, calls: list[Any]) -> None:
        for position, call in enumerate(calls):
            if not isinstance(call, dict):
                continue
            index = call.get("index", position)
            function = call.get("function")
            piece = function.get("arguments") if isinstance(function, dict) else None
            parts = self.tool_args.setdefault(index if isinstance(index, int) else position, [])
            if isinstance(piece, str):
                parts.append(piece)


def first_invalid_arguments(arguments: Any) -> str | None:
    """Strict on purpose: an agent cannot execute a call whose arguments do not parse as an object."""
    for text in arguments:
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            return f"tool call arguments are not JSON: {text[:120]!r}"
        if not isinstance(parsed, dict):
            return f"tool call arguments are not an object: {text[:120]!r}"
    return None
