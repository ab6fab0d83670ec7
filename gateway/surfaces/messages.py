"""The Anthropic Messages API (`POST /v1/messages`): the request translated into the kernel's chat
form (messages_request.py), the kernel's chunks written back as a message or as its stream events.

A streamed message is `message_start`, a `ping`, then its content blocks in order (a `text` block
or a `tool_use` block, each opened with `content_block_start`, filled by `text_delta` /
`input_json_delta` deltas and closed with `content_block_stop`), `message_delta` with the stop
reason and the usage, and `message_stop`. Errors are Anthropic's shape (`{"type": "error",
"error": {"type", "message"}}`) with its statuses, before the first event and in-band alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.core.answer import Answer
from gateway.core.chunks import Chunk, ToolCallDelta, Usage
from gateway.core.surface import AnswerHead, ParsedRequest
from gateway.errors import GatewayError
from gateway.surfaces.chat_request import decode_json, validate_chat_request
from gateway.surfaces.messages_request import translate
from gateway.surfaces.typed_events import typed_frame

MESSAGES = "/v1/messages"
# Anthropic's status for "no capacity, try again": the gateway's 502 and 503 (no deployment could
# answer: every one down, failing or full), which its SDK retries as it retries Anthropic's.
_OVERLOADED = 529
_NO_CAPACITY = frozenset({502, 503})
# Anthropic's error type by the gateway error's status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "overloaded_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def _stop_sequence(extra: Mapping[str, Any]) -> str | None:
    """The stop sequence a backend says it stopped at (vLLM: the choice's `stop_reason`)."""
    matched = extra.get("stop_reason")
    return matched if isinstance(matched, str) else None


def _input(arguments: str) -> Any:
    try:
        return orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}  # a model's broken arguments: the tool policy judged the text, the agent gets an object


def message_object(
    head: AnswerHead, content: list[dict[str, Any]], reason: str | None, stop: str | None
) -> dict[str, Any]:
    return {
        "id": head.answer_id,
        "type": "message",
        "role": "assistant",
        "model": head.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


@dataclass(slots=True)
class _Block:
    index: int
    kind: str  # "text" | "tool_use"
    arguments: list[str] = field(default_factory=list)


class MessagesWriter:
    """One streamed message's events (AnswerWriter): a text block opened by the first text, a
    tool_use block per tool call (closing what was open), everything closed at the end."""

    def __init__(self, head: AnswerHead) -> None:
        self._head = head
        self._started = False
        self._blocks = 0
        self._open: _Block | None = None
        self._calls: dict[int, _Block] = {}  # by the model's tool-call index
        self._finish_reason: str | None = None
        self._stop_sequence: str | None = None
        for payload in head.replayed:  # a stream taken over: go on from where the dead writer was
            self._replay(orjson.loads(payload))

    def _replay(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self._started = True
        elif kind == "content_block_start":
            block = _Block(int(event["index"]), str(event["content_block"]["type"]))
            self._open, self._blocks = block, block.index + 1
            if block.kind == "tool_use":
                self._calls[len(self._calls)] = block
        elif kind == "content_block_stop":
            self._open = None

    def chunk(self, chunk: Chunk) -> list[bytes]:
        events = self._start()
        for piece in chunk.text_pieces():
            events += self._text(piece)
        for delta in chunk.tool_calls:
            events += self._call(delta)
        if chunk.finish_reason is not None:
            self._finish_reason = chunk.finish_reason
            self._stop_sequence = _stop_sequence(chunk.choice_extra)
        return events

    def end(self, usage: Usage) -> list[bytes]:
        events = self._start() + self._close()
        delta = {
            "stop_reason": stop_reason(self._finish_reason, self._stop_sequence),
            "stop_sequence": self._stop_sequence,
        }
        counts = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}
        events.append(_event({"type": "message_delta", "delta": delta, "usage": counts}))
        return [*events, _event({"type": "message_stop"})]

    def fail(self, error: GatewayError) -> list[bytes]:
        return [orjson.dumps(error_body(error))]

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message = message_object(self._head, [], None, None)
        return [_event({"type": "message_start", "message": message}), _event({"type": "ping"})]

    def _open_block(self, kind: str, content_block: dict[str, Any]) -> tuple[_Block, list[bytes]]:
        events = self._close()
        block = self._open = _Block(self._blocks, kind)
        self._blocks += 1
        events.append(_event({"type": "content_block_start", "index": block.index, "content_block": content_block}))
        return block, events

    def _close(self) -> list[bytes]:
        block, self._open = self._open, None
        return [] if block is None else [_event({"type": "content_block_stop", "index": block.index})]

    def _text(self, piece: str) -> list[bytes]:
        events: list[bytes] = []
        block = self._open
        if block is None or block.kind != "text":
            block, events = self._open_block("text", {"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": piece}
        return [*events, _event({"type": "content_block_delta", "index": block.index, "delta": delta})]

    def _call(self, delta: ToolCallDelta) -> list[bytes]:
        events: list[bytes] = []
        block = self._calls.get(delta.index)
        if block is None:
            content_block = {"type": "tool_use", "id": delta.id or "", "name": delta.name or "", "input": {}}
            block, events = self._open_block("tool_use", content_block)
            self._calls[delta.index] = block
        if delta.arguments and block is self._open:
            json_delta = {"type": "input_json_delta", "partial_json": delta.arguments}
            events.append(_event({"type": "content_block_delta", "index": block.index, "delta": json_delta}))
        return events


def _event(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)


def error_body(error: GatewayError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


class Messages:
    """The surface (gateway/core/surface.py's `Surface`)."""

    name = "messages"
    path = MESSAGES
    id_prefix = "msg_"
    answer_sessions = False  # a client names its sessions (X-Session-Id), as on the chat endpoint
    done = None  # the stream ends with message_stop

    def parse(self, body: bytes, max_json_depth: int) -> ParsedRequest:
        translated = translate(decode_json(body, max_json_depth))
        request = validate_chat_request(translated.chat)  # the kernel's own invariants, as for chat
        return ParsedRequest(translated.chat, request.model, translated.stream, True)

    def writer(self, head: AnswerHead) -> MessagesWriter:
        return MessagesWriter(head)

    def collected(self, head: AnswerHead, answer: Answer, usage: Usage) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if answer.content:
            content.append({"type": "text", "text": answer.content})
        for call in answer.tool_calls:
            function = call["function"]
            content.append(
                {"type": "tool_use", "id": call["id"], "name": function["name"], "input": _input(function["arguments"])}
            )
        stop = _stop_sequence(answer.choice_extra)
        message = message_object(head, content, stop_reason(answer.finish_reason, stop), stop)
        message["usage"] = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}
        return message

    def error_status(self, error: GatewayError) -> int:
        return _OVERLOADED if error.status in _NO_CAPACITY else error.status

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def frame(self, seq: int | None, payload: bytes) -> bytes:
        return typed_frame(seq, payload)

    def text_of(self, payload: bytes) -> str:
        if not payload.startswith(b'{"type":"content_block_delta"') or b'"text_delta"' not in payload:
            return ""
        delta = orjson.loads(payload).get("delta") or {}
        text = delta.get("text")
        return text if isinstance(text, str) else ""

    def answer_of(self, payload: bytes) -> dict[str, Any] | None:
        return None  # messages are not kept as objects

    def answer_items(self, answer: Mapping[str, Any]) -> list[dict[str, Any]]:
        return []
