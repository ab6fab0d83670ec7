"""A chat-completions request, validated at the edge.

The validated model only judges the body; what goes upstream is the client's own dict, so
parameters we do not know (and future OpenAI ones) pass through untouched - within the size
and nesting limits, which cover the whole body, unknown parameters included.

The legacy functions API (`functions`, `function_call`, `role: "function"`) is refused with a
400 rather than translated: the tool policy judges `tools` / `tool_calls` / `role: "tool"` only,
and a second vocabulary for the same thing is a second way around it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, TypeAdapter, ValidationError

from common.problems import key_path
from gateway.errors import InvalidRequest, UnsupportedParameter


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class FunctionCall(_Lenient):
    name: StrictStr
    arguments: StrictStr


class ToolCall(_Lenient):
    id: Annotated[StrictStr, Field(min_length=1)]
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
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


def decode_json(body: bytes, max_depth: int) -> Any:
    if not body:
        raise InvalidRequest("Request body is empty; expected a JSON object", code="invalid_json")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower():
            raise _too_deep(max_depth) from None
        raise InvalidRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    check_depth(payload, max_depth)
    return payload


def check_depth(payload: Any, max_depth: int) -> None:
    """Refuse JSON nested deeper than `max_depth` (iteratively: the check itself must not recurse)."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise _too_deep(max_depth)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))


def _too_deep(max_depth: int) -> InvalidRequest:
    return InvalidRequest(
        f"Request body is nested deeper than the limit of {max_depth} levels (server.max_json_depth)",
        code="json_too_deep",
    )


def validate_chat_request(payload: Any) -> ChatCompletionRequest:
    if not isinstance(payload, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    for legacy in ("functions", "function_call"):
        if legacy in payload:
            raise _legacy(legacy)
    request = _validate(payload)
    for index, message in enumerate(payload["messages"]):
        if message["role"] == "function":
            raise _legacy(f"messages[{index}].role")
        if "function_call" in message:
            raise _legacy(f"messages[{index}].function_call")
    if request.n is not None and request.n != 1:
        raise UnsupportedParameter("Only n=1 is supported", param="n")
    if request.tool_choice is not None and request.tools is None and request.tool_choice != "none":
        raise InvalidRequest("tool_choice is set but no tools are given", param="tool_choice")
    return request


def _validate(payload: dict[str, Any]) -> ChatCompletionRequest:
    """The validated request. A long conversation is validated a slice of messages at a time:
    pydantic holds the GIL for the whole of one call, and in a worker thread that would still
    stop the event loop for as long as it takes (0.6 s for 90k messages)."""
    messages = payload.get("messages")
    many = messages if isinstance(messages, list) and len(messages) > _MESSAGES_PER_CALL else None
    try:
        request = ChatCompletionRequest.model_validate({**payload, "messages": many[:1]} if many else payload)
    except ValidationError as exc:
        raise _invalid(exc) from None
    if many:
        for start in range(1, len(many), _MESSAGES_PER_CALL):
            try:
                _MESSAGES.validate_python(many[start : start + _MESSAGES_PER_CALL])
            except ValidationError as exc:
                raise _invalid(exc, ("messages",), start) from None
    return request


_MESSAGES = TypeAdapter(list[Message])
_MESSAGES_PER_CALL = 500


def _legacy(param: str) -> UnsupportedParameter:
    return UnsupportedParameter(
        f"'{param}' belongs to the legacy functions API, which this gateway does not accept: "
        "use 'tools', 'tool_calls' and messages with role 'tool'",
        param=param,
    )


def parse_chat_request(body: bytes, max_depth: int) -> tuple[dict[str, Any], ChatCompletionRequest]:
    payload = decode_json(body, max_depth)
    return payload, validate_chat_request(payload)


def _invalid(exc: ValidationError, within: tuple[str, ...] = (), offset: int = 0) -> InvalidRequest:
    """The first problem, named by its path in the client's body (`within` and `offset` place a
    slice validated on its own)."""
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    if within and loc and isinstance(loc[0], int):
        loc = (*within, loc[0] + offset, *loc[1:])
    param = key_path(loc, skip=_pydantic_name)
    if error["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    return InvalidRequest(f"Invalid value for '{param}': {error['msg']}", param=param, code="invalid_value")


_PYDANTIC_BRANCHES = frozenset({"str", "int", "float", "bool", "none"})


def _pydantic_name(part: str) -> bool:
    """pydantic's names for union branches and validators, not the client's keys."""
    return part in _PYDANTIC_BRANCHES or "[" in part or "-" in part
