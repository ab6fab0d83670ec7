"""OpenAI embeddings (`POST /v1/embeddings`): the request checked at the edge and passed on as it
is to a deployment that serves embeddings (`serves: [embeddings]`); the answer is OpenAI's list.

Through the one pipeline like any request (keys and scopes, quotas charged the input's tokens,
routing with retries, breakers and failover before the answer, one audit record naming the
surface); it is never streamed, so sessions, tool policy and failover mid-answer have nothing to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.core.answer import Answer
from gateway.core.chunks import Chunk, Usage
from gateway.core.error_bodies import gateway_error_body
from gateway.core.surface import AnswerHead, ParsedRequest
from gateway.errors import GatewayError, InvalidRequest, UnsupportedParameter
from gateway.surfaces.chat_request import decode_json

EMBEDDINGS = "/v1/embeddings"
_KNOWN = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
_MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


def validate(payload: Any) -> dict[str, Any]:
    """The body as it goes upstream, once it is an embeddings request OpenAI would take."""
    if not isinstance(payload, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    for name in payload:
        if name not in _KNOWN:
            raise UnsupportedParameter(f"Unknown parameter: '{name}'", param=name)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("Invalid value for 'model': expected a non-empty string", param="model")
    _check_input(payload.get("input"))
    if payload.get("encoding_format", "float") not in ("float", "base64"):
        raise InvalidRequest(
            "Invalid value for 'encoding_format': expected 'float' or 'base64'", param="encoding_format"
        )
    dimensions = payload.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise InvalidRequest("Invalid value for 'dimensions': expected an integer of at least 1", param="dimensions")
    if payload.get("user") is not None and not isinstance(payload["user"], str):
        raise InvalidRequest("Invalid type for 'user': expected a string", param="user", code="invalid_type")
    return payload


def _check_input(given: Any) -> None:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids; none empty."""
    if isinstance(given, str):
        return
    if isinstance(given, list) and given and len(given) <= _MAX_INPUTS:
        if all(isinstance(item, str) for item in given) or _token_ids(given):
            return
        if all(isinstance(item, list) and item and _token_ids(item) for item in given):
            return
    raise InvalidRequest(
        f"Invalid value for 'input': expected a string, or a list (1 to {_MAX_INPUTS}) of strings, of token ids "
        "or of lists of token ids",
        param="input",
    )


def _token_ids(items: list[Any]) -> bool:
    return all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in items)


class _NeverStreamed:
    """The AnswerWriter of a surface whose answers are never streamed (`parse` says stream: false)."""

    def chunk(self, chunk: Chunk) -> list[bytes]:
        return []

    def end(self, usage: Usage) -> list[bytes]:
        return []

    def fail(self, error: GatewayError) -> list[bytes]:
        return []


class Embeddings:
    """The surface (gateway/core/surface.py's `Surface`)."""

    name = "embeddings"
    path = EMBEDDINGS
    id_prefix = "emb-"
    answer_sessions = False
    done = None

    def parse(self, body: bytes, max_json_depth: int) -> ParsedRequest:
        payload = validate(decode_json(body, max_json_depth))
        return ParsedRequest(payload, payload["model"], False, False, operation="embeddings")

    def writer(self, head: AnswerHead) -> _NeverStreamed:
        return _NeverStreamed()

    def collected(self, head: AnswerHead, answer: Answer, usage: Usage) -> dict[str, Any]:
        data = answer.extra.get("data")
        return {
            "object": "list",
            "data": data if isinstance(data, list) else [],
            "model": head.model,
            "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens},
        }

    def error_status(self, error: GatewayError) -> int:
        return error.status

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return gateway_error_body(error)

    def frame(self, seq: int | None, payload: bytes) -> bytes:
        return b"data: %s\n\n" % payload

    def text_of(self, payload: bytes) -> str:
        return ""

    def answer_of(self, payload: bytes) -> dict[str, Any] | None:
        return None

    def answer_items(self, answer: Mapping[str, Any]) -> list[dict[str, Any]]:
        return []
