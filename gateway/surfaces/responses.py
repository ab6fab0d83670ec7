"""The Responses API (`POST /v1/responses`): the request translated into the kernel's chat form
(responses_request.py), the kernel's chunks written back as a response object or as its typed
stream events.

A streamed response is a sequence of events, each with a `sequence_number` one higher than the
last: `response.created` and `response.in_progress` first; an output item (`message` with one
`output_text` part, or a `function_call`) is opened with `response.output_item.added`, filled by
its deltas and closed with its `.done` events; the stream ends with `response.completed`,
`response.incomplete` (the output-token limit) or `response.failed` (with the error). Every event
is an SSE event named by its `type`. Errors before any output are OpenAI's error shape with its
status, as on the chat endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from gateway.core.answer import Answer
from gateway.core.chunks import Chunk, ToolCallDelta, Usage
from gateway.core.error_bodies import gateway_error_body
from gateway.core.surface import AnswerHead, ParsedRequest
from gateway.errors import GatewayError, GenerationCancelled
from gateway.surfaces.chat_request import decode_json, validate_chat_request
from gateway.surfaces.responses_request import ECHO_DEFAULTS, translate
from gateway.surfaces.typed_events import typed_frame

RESPONSES = "/v1/responses"


def response_usage(usage: Usage) -> dict[str, Any]:
    cached = (usage.extra.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.extra.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.total_tokens,
    }


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(
    head: AnswerHead,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None = None,
    incomplete: dict[str, str] | None = None,
    error: GatewayError | None = None,
) -> dict[str, Any]:
    return {
        "id": head.answer_id,
        "object": "response",
        "created_at": head.created,
        "status": status,
        "model": head.model,
        "output": output,
        "usage": response_usage(usage) if usage is not None else None,
        "error": {"code": _error_code(error), "message": error.message} if error is not None else None,
        "incomplete_details": incomplete,
        **ECHO_DEFAULTS,  # an in-band error written from a stored session's state has only these
        **head.echo,
    }


def _error_code(error: GatewayError) -> str:
    return "rate_limit_exceeded" if error.status == 429 else "server_error"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" or text else [],
    }


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`extra`: what the gateway adds to a call (an approved call's `approval_id` and
    `approval_token`, which the agent sends back with the call's output)."""
    return {
        **(extra or {}),
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


_CALL_FIELDS = frozenset({"id", "type", "status", "call_id", "name", "arguments"})


@dataclass(slots=True)
class _OpenItem:
    output_index: int
    item_id: str
    text: list[str] = field(default_factory=list)  # a message's text, a call's arguments
    call_id: str = ""
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    _delta_head: bytes = b""

    def text_delta(self, piece: str, seq: int) -> bytes:
        """A message's `response.output_text.delta` event, byte for byte what `_event` makes of it
        (same keys, same order), from bytes made once per item: a stream's most frequent event."""
        if not self._delta_head:
            self._delta_head = (
                b'{"type":"response.output_text.delta","item_id":%s,"output_index":%d,"content_index":0,"delta":'
                % (
                    orjson.dumps(self.item_id),
                    self.output_index,
                )
            )
        return b'%s%s,"logprobs":[],"sequence_number":%d}' % (self._delta_head, orjson.dumps(piece), seq)


class ResponsesWriter:
    """One streamed response's events (AnswerWriter): output items opened as their first delta
    arrives, a message closed when a tool call begins, everything closed at the end."""

    def __init__(self, head: AnswerHead) -> None:
        self._head = head
        self._suffix = head.answer_id.removeprefix("resp_")
        self._seq = 0
        self._started = False
        self._output: list[dict[str, Any]] = []  # finished items, by output index
        self._message: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}  # by the model's tool-call index
        self._finish_reason: str | None = None
        for payload in head.replayed:  # a stream taken over: go on from where the dead writer was
            self._replay(orjson.loads(payload))

    def _replay(self, event: dict[str, Any]) -> None:
        """Take up the state an event this writer (on another replica) wrote leaves behind."""
        kind, item = event.get("type"), event.get("item") or {}
        self._seq = int(event.get("sequence_number", self._seq - 1)) + 1
        if kind == "response.created":
            self._started = True
            response = event.get("response") or {}
            self._head = replace(self._head, echo={k: response[k] for k in ECHO_DEFAULTS if k in response})
        elif kind == "response.output_item.added" and item.get("type") == "message":
            self._message = _OpenItem(int(event["output_index"]), str(item["id"]))
        elif kind == "response.output_item.added":
            extra = {k: v for k, v in item.items() if k not in _CALL_FIELDS}
            call = _OpenItem(int(event["output_index"]), str(item["id"]), [], item["call_id"], item["name"], extra)
            self._calls[len(self._calls)] = call
        elif kind == "response.output_text.delta" and self._message is not None:
            self._message.text.append(str(event["delta"]))
        elif kind == "response.function_call_arguments.delta":
            for call in self._calls.values():
                if call.item_id == event["item_id"]:
                    call.text.append(str(event["delta"]))
        elif kind == "response.output_item.done":
            self._output.append(item)
            if item.get("type") == "message":
                self._message = None
            else:
                self._calls = {i: c for i, c in self._calls.items() if c.item_id != item.get("id")}

    def chunk(self, chunk: Chunk) -> list[bytes]:
        events = self._start()
        for piece in chunk.text_pieces():
            events += self._text(piece)
        for delta in chunk.tool_calls:
            events += self._call(delta)
        if chunk.finish_reason is not None:
            self._finish_reason = chunk.finish_reason
        return events

    def end(self, usage: Usage) -> list[bytes]:
        events = self._start() + self._close_all()
        status, incomplete = _status(self._finish_reason)
        response = response_object(self._head, status, self._output, usage, incomplete)
        return [*events, self._event(f"response.{status}", response=response)]

    def fail(self, error: GatewayError) -> list[bytes]:
        events = self._start() + self._close_all()
        if isinstance(error, GenerationCancelled):  # cancelled (POST .../cancel): no error, as at OpenAI
            response = response_object(self._head, "cancelled", self._output)
        else:
            response = response_object(self._head, "failed", self._output, error=error)
        # The API has no event of its own for a cancelled response: the stream ends as one that failed.
        return [*events, self._event("response.failed", response=response)]

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = orjson.dumps({"type": kind, **fields, "sequence_number": self._seq})
        self._seq += 1
        return payload

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        response = response_object(self._head, "in_progress", [])
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def _next_index(self) -> int:
        return len(self._output) + (self._message is not None) + len(self._calls)

    def _text(self, piece: str) -> list[bytes]:
        events: list[bytes] = []
        message = self._message
        if message is None:
            message = self._message = _OpenItem(self._next_index(), f"msg_{self._suffix}_{self._next_index()}")
            item = message_item(message.item_id, "", "in_progress")
            events.append(self._event("response.output_item.added", output_index=message.output_index, item=item))
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=message.item_id,
                    output_index=message.output_index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        message.text.append(piece)
        events.append(message.text_delta(piece, self._seq))
        self._seq += 1
        return events

    def _call(self, delta: ToolCallDelta) -> list[bytes]:
        events: list[bytes] = []
        call = self._calls.get(delta.index)
        if call is None:
            events += self._close_message()
            index = self._next_index()
            call = _OpenItem(index, f"fc_{self._suffix}_{index}", call_id=delta.id or f"call_{self._suffix}_{index}")
            call.name = delta.name or ""
            call.extra.update(delta.extra)
            self._calls[delta.index] = call
            item = call_item(call.item_id, call.call_id, call.name, "", "in_progress", call.extra)
            events.append(self._event("response.output_item.added", output_index=index, item=item))
        else:
            call.name += delta.name or ""
            call.extra.update(delta.extra)
        if delta.arguments:
            call.text.append(delta.arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.item_id,
                    output_index=call.output_index,
                    delta=delta.arguments,
                )
            )
        return events

    def _close_message(self) -> list[bytes]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(message.text)
        where = {"item_id": message.item_id, "output_index": message.output_index, "content_index": 0}
        part = {"type": "output_text", "text": text, "annotations": []}
        item = message_item(message.item_id, text, "completed")
        self._output.append(item)
        return [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=message.output_index, item=item),
        ]

    def _close_all(self) -> list[bytes]:
        events = self._close_message()
        for call in sorted(self._calls.values(), key=lambda c: c.output_index):
            arguments = "".join(call.text)
            item = call_item(call.item_id, call.call_id, call.name, arguments, "completed", call.extra)
            self._output.append(item)
            where = {"item_id": call.item_id, "output_index": call.output_index}
            events.append(self._event("response.function_call_arguments.done", **where, arguments=arguments))
            events.append(self._event("response.output_item.done", output_index=call.output_index, item=item))
        self._calls.clear()
        return events


class Responses:
    """The surface (gateway/core/surface.py's `Surface`)."""

    name = "responses"
    path = RESPONSES
    id_prefix = "resp_"
    answer_sessions = True  # a response is retrieved, continued and resumed by its id
    done = None  # the stream ends with its terminal response event

    def parse(self, body: bytes, max_json_depth: int) -> ParsedRequest:
        translated = translate(decode_json(body, max_json_depth))
        request = validate_chat_request(translated.chat)  # the kernel's own invariants, as for chat
        return ParsedRequest(
            translated.chat, request.model, translated.stream, True, translated.echo, translated.continuity
        )

    def writer(self, head: AnswerHead) -> ResponsesWriter:
        return ResponsesWriter(head)

    def collected(self, head: AnswerHead, answer: Answer, usage: Usage) -> dict[str, Any]:
        suffix = head.answer_id.removeprefix("resp_")
        output = []
        if answer.content is not None:
            output.append(message_item(f"msg_{suffix}_0", answer.content, "completed"))
        for call in answer.tool_calls:
            index = len(output)
            call_id = call["id"] or f"call_{suffix}_{index}"
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            extra = {k: v for k, v in call.items() if k not in ("id", "type", "function")}
            output.append(call_item(f"fc_{suffix}_{index}", call_id, name, arguments, "completed", extra))
        status, incomplete = _status(answer.finish_reason)
        return response_object(head, status, output, usage, incomplete)

    def error_status(self, error: GatewayError) -> int:
        return error.status

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return gateway_error_body(error)

    def frame(self, seq: int | None, payload: bytes) -> bytes:
        return typed_frame(seq, payload)

    def text_of(self, payload: bytes) -> str:
        if not payload.startswith(b'{"type":"response.output_text.delta"'):
            return ""
        delta = orjson.loads(payload).get("delta")
        return delta if isinstance(delta, str) else ""

    def answer_of(self, payload: bytes) -> dict[str, Any] | None:
        if not payload.startswith(_RESPONSE_EVENT):
            return None
        response = orjson.loads(payload).get("response")
        return response if isinstance(response, dict) else None

    def answer_items(self, answer: Mapping[str, Any]) -> list[dict[str, Any]]:
        output = answer.get("output")
        return [item for item in output if isinstance(item, dict)] if isinstance(output, list) else []


# The lifecycle events (created, in_progress, completed, incomplete, failed) carry the response.
_RESPONSE_EVENT = b'{"type":"response.'
