"""Interpreting an SSE stream, event by event: chat-completions chunks, or the Responses API's typed
events (`type` names each; the stream ends with its terminal `response.*` event, not `[DONE]`).

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

# Responses events that carry output (one output time each), and those that end a stream.
_RESPONSES_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    }
)
_RESPONSES_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Anthropic Messages events (their types have no dot): what carries output, and the stop reasons in chat's terms.
_MESSAGES_KINDS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
    }
)
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}

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
        kind = chunk.get("type")
        if kind in _MESSAGES_KINDS:  # an Anthropic Messages API event
            self._messages_event(str(kind), chunk, now)
            return
        if isinstance(kind, str):  # a Responses API event (chat chunks have no `type`)
            self._responses_event(kind, chunk, now)
            return
        self._usage(chunk.get("usage"))
        choices = chunk.get("choices")
        if isinstance(choices, list):
            carried = [self._choice(choice) for choice in choices if isinstance(choice, dict)]
            # Several choices in one chunk still arrived together: one output time per chunk.
            if any(carried):
                self.output_times.append(now)

    def _responses_event(self, kind: str, event: dict[str, Any], now: float) -> None:
        if kind in _RESPONSES_DELTAS:
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self.output_times.append(now)
        elif kind in _RESPONSES_ENDS:
            self.done = True
            response = event.get("response")
            self.read_response(response if isinstance(response, dict) else {})

    def _messages_event(self, kind: str, event: dict[str, Any], now: float) -> None:
        if kind == "content_block_start":
            block = event.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self.tool_args[_index(event, len(self.tool_args))] = []
        elif kind == "content_block_delta":
            delta = _object(event.get("delta"))
            piece = delta.get("text") or delta.get("partial_json") or delta.get("thinking")
            if isinstance(piece, str) and piece:
                self.output_times.append(now)
                if delta.get("type") == "input_json_delta":
                    self.tool_args.setdefault(_index(event, 0), []).append(piece)
        elif kind == "message_delta":
            delta = _object(event.get("delta"))
            self.read_message_end(delta.get("stop_reason"), event.get("usage"))
        elif kind == "message_stop":
            self.done = True

    def read_message_end(self, reason: Any, usage: Any) -> None:
        """A Messages API answer's stop reason (in chat's terms) and output tokens."""
        self.finish_reason = _STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None
        tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int):
            self.usage_tokens = tokens

    def read_response(self, response: dict[str, Any]) -> None:
        """A Responses API response object's end: finish reason (in chat's terms), usage, calls."""
        usage = response.get("usage")
        tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
        self.usage_tokens = tokens if isinstance(tokens, int) else self.usage_tokens
        _, arguments = response_output(response)
        self.tool_args = {n: [text] for n, text in enumerate(arguments)}
        status = response.get("status")
        if status == "completed":
            self.finish_reason = "tool_calls" if arguments else "stop"
        elif status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self.finish_reason = "content_filter" if reason == "content_filter" else "length"
        else:
            self.fail(INBAND_ERROR, f"response {status}: {str(response.get('error'))[:200]}")

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


def response_output(response: dict[str, Any]) -> tuple[str, list[str]]:
    """(the text, each function call's arguments) of a Responses API response object's output."""
    texts: list[str] = []
    arguments: list[str] = []
    output = response.get("output")
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            value = item.get("arguments")
            arguments.append(value if isinstance(value, str) else "")
        elif item.get("type") == "message" and isinstance(item.get("content"), list):
            texts += [p["text"] for p in item["content"] if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "".join(texts), arguments


def _index(event: dict[str, Any], otherwise: int) -> int:
    index = event.get("index")
    return index if isinstance(index, int) else otherwise


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def message_output(message: dict[str, Any]) -> tuple[str, list[str]]:
    """(the text, each tool use's input as JSON) of an Anthropic Messages API message."""
    texts: list[str] = []
    arguments: list[str] = []
    content = message.get("content")
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use":
            arguments.append(orjson.dumps(block.get("input", {})).decode())
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
    return "".join(texts), arguments


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
