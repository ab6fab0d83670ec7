"""Reading and validating a chat-completions request at the edge.

The validated model only judges the body; what goes upstream is the client's own dict, so
parameters we do not know (and future OpenAI ones) pass through untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.requests import Request

from gateway.backends.base import Chunk
from gateway.errors import BodyTooLarge, InvalidRequest, UnsupportedParameter
from gateway.pipeline import Handler, RequestContext


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | None = None


class Function(_Lenient):
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")]
    parameters: dict[str, Any] | None = None


class Tool(_Lenient):
    type: Literal["function"]
    function: Function


class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class ChatCompletionRequest(_Lenient):
    model: Annotated[StrictStr, Field(min_length=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    tools: Annotated[list[Tool], Field(min_length=1)] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None


async def read_json_body(request: Request, limit: int) -> Any:
    """The decoded body, refusing to buffer more than `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"Request body is {declared} bytes; the limit is {limit} bytes")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise BodyTooLarge(f"Request body exceeds the limit of {limit} bytes")
    if not body:
        raise InvalidRequest("Request body is empty; expected a JSON object", code="invalid_json")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None


def validate_chat_request(payload: Any) -> ChatCompletionRequest:
    if not isinstance(payload, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    try:
        request = ChatCompletionRequest.model_validate(payload)
    except ValidationError as exc:
        raise _invalid(exc) from None
    if request.n is not None and request.n != 1:
        raise UnsupportedParameter("Only n=1 is supported", param="n")
    if request.tool_choice is not None and request.tools is None and request.tool_choice != "none":
        raise InvalidRequest("tool_choice is set but no tools are given", param="tool_choice")
    return request


def _invalid(exc: ValidationError) -> InvalidRequest:
    error = exc.errors()[0]
    param = _param_path(error["loc"])
    if error["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    return InvalidRequest(f"Invalid value for '{param}': {error['msg']}", param=param, code="invalid_value")


_PYDANTIC_BRANCHES = frozenset({"str", "int", "float", "bool", "none"})


def _param_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _PYDANTIC_BRANCHES or "[" in part or "-" in part:
            continue  # pydantic's names for union branches and validators, not the client's keys
        else:
            path = f"{path}.{part}" if path else part
    return path


class ParseRequest:
    """The pipeline stage that reads and validates the body, after authentication."""

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body_bytes = max_body_bytes

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        assert ctx.read_body is not None
        payload = await ctx.read_body()
        parsed = validate_chat_request(payload)
        ctx.body = payload
        ctx.model = parsed.model
        ctx.stream = parsed.stream
        ctx.include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk
