"""Chat Completions (`POST /v1/chat/completions`): the surface the kernel's own request form is.

Its requests need no translation (the internal request is an OpenAI chat request's JSON); its
events are `chat.completion.chunk`s framed as `data:` lines, ended by `data: [DONE]`; its errors
are OpenAI's error shape (gateway/core/error_bodies.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.core.answer import Answer
from gateway.core.chunks import Chunk, ToolCallDelta, Usage
from gateway.core.error_bodies import gateway_error_body
from gateway.core.surface import AnswerHead, ParsedRequest
from gateway.errors import GatewayError
from gateway.surfaces.chat_request import decode_json, validate_chat_request

CHAT_COMPLETIONS = "/v1/chat/completions"
_DONE = b"[DONE]"


class ChunkRenderer:
    """Renders chunks for one client response: same id, created and model on every chunk."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self._head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }

    def render(self, chunk: Chunk) -> dict[str, Any] | None:
        """The client's chunk dict, or None for a usage-only chunk (sent at the end, if asked)."""
        delta: dict[str, Any] = dict(chunk.delta_extra)
        if chunk.role is not None:
            delta["role"] = chunk.role
        if chunk.content is not None:
            delta["content"] = chunk.content
        if chunk.reasoning is not None:
            delta["reasoning_content"] = chunk.reasoning
        if chunk.tool_calls:
            delta["tool_calls"] = [_render_tool_call(t) for t in chunk.tool_calls]
        if not delta and chunk.finish_reason is None and not chunk.choice_extra:
            return None
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": chunk.finish_reason}
        choice.update(chunk.choice_extra)
        return {**self._head, **chunk.extra, "choices": [choice]}

    def render_all(self, chunk: Chunk) -> list[dict[str, Any]]:
        """The client's chunk dicts: one for each upstream chunk a joined chunk holds (coalesce.py),
        else the one `render` makes (none for a usage-only chunk)."""
        if chunk.pieces and "".join(chunk.pieces) == chunk.content:  # else a stage rewrote the content
            head = self._head
            return [
                {**head, "choices": [{"index": 0, "delta": {"content": p}, "logprobs": None, "finish_reason": None}]}
                for p in chunk.pieces
            ]
        rendered = self.render(chunk)
        return [] if rendered is None else [rendered]

    def render_usage(self, usage: Usage) -> dict[str, Any]:
        return {**self._head, "choices": [], "usage": usage.to_dict()}


def _render_tool_call(delta: ToolCallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": delta.index, **delta.extra}
    if delta.id is not None:
        out["id"] = delta.id
        out["type"] = "function"
    function: dict[str, str] = {"arguments": delta.arguments}
    if delta.name is not None:
        function["name"] = delta.name
    out["function"] = function
    return out


class ChatCompletionsWriter:
    """A streamed answer as `chat.completion.chunk` events; a failure as OpenAI's error body."""

    def __init__(self, head: AnswerHead) -> None:
        self._renderer = ChunkRenderer(head.answer_id, head.created, head.model)
        self._include_usage = head.include_usage

    def chunk(self, chunk: Chunk) -> list[bytes]:
        return list(map(orjson.dumps, self._renderer.render_all(chunk)))

    def end(self, usage: Usage) -> list[bytes]:
        return [orjson.dumps(self._renderer.render_usage(usage))] if self._include_usage else []

    def fail(self, error: GatewayError) -> list[bytes]:
        return [orjson.dumps(gateway_error_body(error))]


class ChatCompletions:
    """The surface (gateway/core/surface.py's `Surface`)."""

    name = "chat.completions"
    path = CHAT_COMPLETIONS
    id_prefix = "chatcmpl-"
    answer_sessions = False  # a client names its sessions (X-Session-Id); answers are not objects
    done = _DONE

    def parse(self, body: bytes, max_json_depth: int) -> ParsedRequest:
        payload = decode_json(body, max_json_depth)
        request = validate_chat_request(payload)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        return ParsedRequest(payload, request.model, request.stream, include_usage)

    def writer(self, head: AnswerHead) -> ChatCompletionsWriter:
        return ChatCompletionsWriter(head)

    def collected(self, head: AnswerHead, answer: Answer, usage: Usage) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.reasoning is not None:
            message["reasoning_content"] = answer.reasoning
        if answer.tool_calls:
            message["tool_calls"] = answer.tool_calls
        message.update(answer.message_extra)
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason}
        choice.update(answer.choice_extra)
        return {
            "id": head.answer_id,
            "object": "chat.completion",
            "created": head.created,
            "model": head.model,
            **answer.extra,
            "choices": [choice],
            "usage": usage.to_dict(),
        }

    def error_status(self, error: GatewayError) -> int:
        return error.status

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return gateway_error_body(error)

    def frame(self, seq: int | None, payload: bytes) -> bytes:
        if seq is None:
            return b"data: " + payload + b"\n\n"
        return b"id: %d\ndata: %s\n\n" % (seq, payload)

    def text_of(self, payload: bytes) -> str:
        if payload == _DONE or b'"content"' not in payload:
            return ""
        event = orjson.loads(payload)
        choices = event.get("choices") or ()
        return "".join((c.get("delta") or {}).get("content") or "" for c in choices)

    def answer_of(self, payload: bytes) -> dict[str, Any] | None:
        return None  # chat completions are not kept as objects

    def answer_items(self, answer: Mapping[str, Any]) -> list[dict[str, Any]]:
        return []
