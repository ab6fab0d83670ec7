"""OpenAI wire format: SSE chunks, completion bodies and error bodies.

The per-token chunk is on the hot path of load tests, so `ChunkEncoder` pre-encodes everything that
is the same for every chunk of a stream and only serialises the token itself.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import orjson

from sim.reply import Reply
from sim.tools import ToolCall

SSE_MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def dumps(document: Any) -> bytes:
    """orjson, or the standard library for what orjson refuses (a usage fault's 2**64)."""
    try:
        return orjson.dumps(document)
    except TypeError:
        return json.dumps(document, separators=(",", ":")).encode()


def new_completion_id() -> str:
    return "chatcmpl-sim-" + os.urandom(12).hex()


def error_type_for(status: int) -> str:
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> bytes:
    """An OpenAI-shaped error document."""
    error = {"message": message, "type": error_type_for(status), "param": param, "code": code}
    return orjson.dumps({"error": error})


def usage_dict(reply: Reply) -> dict[str, int | float]:
    if reply.reported_usage is not None:
        lie = reply.reported_usage
        return {"prompt_tokens": lie, "completion_tokens": lie, "total_tokens": lie}
    completion = reply.completion_tokens
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": reply.prompt_tokens + completion,
    }


def completion_body(reply: Reply, completion_id: str, created: int) -> dict[str, Any]:
    """The non-streaming `chat.completion` document."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_call is not None:
        message = {"role": "assistant", "content": None, "tool_calls": [reply.tool_call.as_message_item()]}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": reply.model,
        "choices": [choice],
        "usage": usage_dict(reply),
    }


class ChunkEncoder:
    """Builds the `data: ...` events of one `chat.completion.chunk` stream."""

    __slots__ = ("_choice_head", "_choice_tail", "_head")

    def __init__(self, completion_id: str, model: str, created: int | None = None) -> None:
        stamp = int(time.time()) if created is None else created
        envelope = {"id": completion_id, "object": "chat.completion.chunk", "created": stamp, "model": model}
        # Everything up to the opening of `choices`, shared by every event of the stream.
        self._head = b"data: " + orjson.dumps(envelope)[:-1] + b',"choices":'
        self._choice_head = self._head + b'[{"index":0,"delta":'
        self._choice_tail = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def delta(self, delta: dict[str, Any]) -> bytes:
        return self._choice_head + orjson.dumps(delta) + self._choice_tail

    def role(self, content: str | None = "") -> bytes:
        return self.delta({"role": "assistant", "content": content})

    def content(self, token: str) -> bytes:
        return self._choice_head + b'{"content":' + orjson.dumps(token) + b"}" + self._choice_tail

    def tool_header(self, call: ToolCall) -> bytes:
        item = {
            "index": 0,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        return self.delta({"tool_calls": [item]})

    def tool_arguments(self, fragment: str) -> bytes:
        return self.delta({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]})

    def finish(self, reason: str) -> bytes:
        return self._choice_head + b'{},"logprobs":null,"finish_reason":' + orjson.dumps(reason) + b"}]}\n\n"

    def usage(self, reply: Reply) -> bytes:
        return self._head + b'[],"usage":' + dumps(usage_dict(reply)) + b"}\n\n"

    def malformed(self) -> bytes:
        """A chunk cut off mid-JSON, as a broken proxy or a crashed encoder would leave it."""
        return self._choice_head + b'{"content":"\n\n'


def sse_error(message: str, code: str) -> bytes:
    """An error event inside an otherwise successful stream (vLLM and others do this)."""
    return b"data: " + error_body(message, 500, code=code) + b"\n\n"
