"""A Responses API request (`POST /v1/responses`), validated and turned into the kernel's form.

The kernel speaks chat completions, so the translation is total: every parameter is either
mapped onto the chat request (`input` items to messages, `instructions` to a system message,
function `tools`, `tool_choice`, `max_output_tokens`, `text.format`), kept to be repeated in the
response object (`metadata`, `store`, `user`, ...), accepted as a hint with no effect here
(`_HINTS`), or refused with a 400 naming it. Nothing unknown passes silently: a parameter the
gateway does not understand would otherwise change nothing, and the agent would not know.

A response is kept (`store`, true unless the request says false) with its input items, and a
request naming it in `previous_response_id` continues its conversation (`Continuity`: the
session stage puts the stored conversation after this request's instructions, which are not
inherited, as OpenAI documents). A `background` response is streamed into
its session whatever the client does (the kernel sees a streamed request), and the client gets
the response as it began, or its events with `stream: true`. Refused until they are built:
`item_reference` items, `conversation`, `prompt`, and the built-in tools (web search, file search, ...),
which run at OpenAI and have no backend here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from gateway.core.surface import Continuity
from gateway.errors import InvalidRequest, UnsupportedParameter

# Accepted and not acted on: caching, tiering and safety hints of OpenAI's own service.
_HINTS = frozenset(
    {"include", "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "truncation"}
)
_MAPPED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "metadata",
        "store",
        "user",
        "stream",
        "reasoning",
        "previous_response_id",
        "background",
    }
)
_NOT_YET = {
    "conversation": "conversations are not kept by this gateway yet: send the whole conversation in 'input'",
    "prompt": "stored prompts are not supported: send 'instructions' and 'input'",
}
_APPROVAL_FIELDS = ("approval_id", "approval_token")
_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_TOOL_CHOICES = frozenset({"none", "auto", "required"})


@dataclass(frozen=True, slots=True)
class TranslatedRequest:
    chat: dict[str, Any]  # the chat request the pipeline runs
    echo: dict[str, Any]  # what the response object repeats of the request
    stream: bool
    continuity: Continuity


def translate(payload: Any) -> TranslatedRequest:
    if not isinstance(payload, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    _refuse_unknown(payload)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _missing_or_invalid(payload, "model", "a non-empty string")
    messages = _messages(payload)
    continuity = _continuity(payload)  # after the input was checked: it keeps the input's items
    # A background response streams into its session, read or not.
    stream = (_optional(payload, "stream", bool) or False) or continuity.background
    chat: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
    if stream:
        chat["stream_options"] = {"include_usage": True}  # response.completed carries the usage
    tools = _tools(payload.get("tools"))
    if tools:
        chat["tools"] = tools
    if "tool_choice" in payload and payload["tool_choice"] is not None:
        chat["tool_choice"] = _tool_choice(payload["tool_choice"], has_tools=bool(tools))
    for name, chat_name, kind in _SCALARS:
        value = _optional(payload, name, kind)
        if value is not None:
            chat[chat_name] = value
    if isinstance(chat.get("max_tokens"), int) and chat["max_tokens"] < 1:
        raise InvalidRequest("Invalid value for 'max_output_tokens': must be at least 1", param="max_output_tokens")
    response_format = _response_format(payload.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    effort = _reasoning_effort(payload.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    return TranslatedRequest(chat, _echo(payload), stream, continuity)


def _continuity(payload: dict[str, Any]) -> Continuity:
    store = _optional(payload, "store", bool)
    store = True if store is None else store
    previous = _optional(payload, "previous_response_id", str)
    if previous is not None and not previous:
        raise InvalidRequest(
            "Invalid value for 'previous_response_id': expected a response id", param="previous_response_id"
        )
    preamble = 1 if _optional(payload, "instructions", str) else 0
    background = _optional(payload, "background", bool) or False
    if background and not store:
        raise InvalidRequest("Background responses must be stored: 'background' needs 'store' true", param="store")
    items = input_items(payload["input"]) if store else ()
    events = background and (_optional(payload, "stream", bool) or False)
    return Continuity(store, previous, preamble, items, background, events)


def input_items(given: str | list[Any]) -> tuple[dict[str, Any], ...]:
    """The (already validated) input as the items a stored response lists, each with an id."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    return tuple(_stored_item(item) for item in given)


def _stored_item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "function_call":
        fields = {k: item[k] for k in ("call_id", "name", "arguments", *_APPROVAL_FIELDS) if k in item}
        return {"id": item.get("id") or _item_id("fc"), "type": kind, **fields, "status": "completed"}
    if kind == "function_call_output":
        output = item["output"]
        return {"id": item.get("id") or _item_id("fco"), "type": kind, "call_id": item["call_id"], "output": output}
    role, content = item["role"], item["content"]
    if isinstance(content, str):
        content = [{"type": "output_text" if role == "assistant" else "input_text", "text": content}]
    return {"id": item.get("id") or _item_id("msg"), "type": "message", "role": role, "content": content}


def _item_id(prefix: str) -> str:
    # Unique within a response's chain is all an item id needs (access is by the response's id and
    # key, never by an item's): the interpreter's generator (reseeded in a forked worker), not a
    # system call per item.
    return f"{prefix}_{random.getrandbits(96):024x}"


_SCALARS: tuple[tuple[str, str, type | tuple[type, ...]], ...] = (
    ("max_output_tokens", "max_tokens", int),
    ("temperature", "temperature", (int, float)),
    ("top_p", "top_p", (int, float)),
    ("parallel_tool_calls", "parallel_tool_calls", bool),
    ("user", "user", str),
)


def _refuse_unknown(payload: dict[str, Any]) -> None:
    for name, value in payload.items():
        if name in _NOT_YET and value not in (None, False):
            raise UnsupportedParameter(f"'{name}' is not supported: {_NOT_YET[name]}", param=name)
        if name not in _MAPPED and name not in _HINTS and name not in _NOT_YET:
            raise UnsupportedParameter(f"Unknown parameter: '{name}'", param=name)


def _one_of(value: Any, allowed: frozenset[str]) -> bool:
    """Membership for a value from JSON, which may be a list or an object (unhashable)."""
    return isinstance(value, str) and value in allowed


def _optional(payload: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(name)
    if value is None:
        return None
    # bool is an int to Python, and not a number to JSON Schema: true is no temperature.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise InvalidRequest(f"Invalid type for '{name}'", param=name, code="invalid_type")
    return value


def _missing_or_invalid(payload: dict[str, Any], name: str, expected: str) -> InvalidRequest:
    if name not in payload:
        return InvalidRequest(f"Missing required parameter: '{name}'", param=name, code="missing_required_parameter")
    return InvalidRequest(f"Invalid value for '{name}': expected {expected}", param=name, code="invalid_value")


def _messages(payload: dict[str, Any]) -> list[dict[str, Any]]:
    conversation = _Conversation()
    instructions = _optional(payload, "instructions", str)
    if instructions:
        conversation.messages.append({"role": "system", "content": instructions})
    items = payload.get("input")
    if isinstance(items, str):
        conversation.messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and items:
        for index, item in enumerate(items):
            conversation.add(item, f"input[{index}]")
    else:
        raise _missing_or_invalid(payload, "input", "a string or a non-empty list of items")
    if all(m["role"] == "system" for m in conversation.messages):
        raise InvalidRequest("'input' holds no message to answer", param="input")
    return conversation.messages


class _Conversation:
    """Input items as chat messages. Consecutive `function_call` items are one assistant turn's
    parallel calls, so they become one assistant message with several tool calls."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] | None = None  # the tool calls of the turn still open

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise InvalidRequest(f"Invalid value for '{where}': expected an object", param=where, code="invalid_value")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "function_call":
            call = {
                "id": _field(item, "call_id", where),
                "type": "function",
                "function": {"name": _field(item, "name", where), "arguments": _field(item, "arguments", where)},
                # An approved call's binding, as the gateway returned it: the tool policy checks it.
                **{k: item[k] for k in _APPROVAL_FIELDS if k in item},
            }
            if self._calls is None:
                self._calls = []
                self.messages.append({"role": "assistant", "content": None, "tool_calls": self._calls})
            self._calls.append(call)
            return
        self._calls = None
        if kind == "message":
            self.messages.append(_message(item, where))
        elif kind == "function_call_output":
            call_id = _field(item, "call_id", where)
            content = _text(item.get("output"), f"{where}.output")
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            raise UnsupportedParameter(
                f"Input items of type {kind!r} are not supported: use 'message', 'function_call' and "
                "'function_call_output' items",
                param=f"{where}.type",
            )


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not _one_of(role, _MESSAGE_ROLES):
        raise InvalidRequest(
            f"Invalid value for '{where}.role': expected one of user, system, developer, assistant",
            param=f"{where}.role",
            code="invalid_value",
        )
    content = _text(item.get("content"), f"{where}.content")
    return {"role": role, "content": content}


def _text(content: Any, where: str) -> str:
    """Text content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"Invalid value for '{where}': expected a string or a list of parts", param=where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not _one_of(kind, _TEXT_PARTS) or not isinstance(part.get("text"), str):
            raise UnsupportedParameter(
                f"Content parts of type {kind!r} are not supported: only text parts ('input_text', 'output_text')",
                param=f"{where}[{index}].type",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidRequest(
            f"Missing or invalid '{where}.{name}': expected a string", param=f"{where}.{name}", code="invalid_value"
        )
    return value


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("Invalid value for 'tools': expected a list", param="tools")
    converted = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise UnsupportedParameter(
                f"Tools of type {kind!r} are not supported: only 'function' tools (the model's tool calls are "
                "returned to the agent, or run at the gateway's MCP endpoint)",
                param=f"{where}.type",
            )
        function = {"name": _field(tool, "name", where)}
        for optional in ("description", "parameters", "strict"):
            if tool.get(optional) is not None:
                function[optional] = tool[optional]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any, has_tools: bool) -> Any:
    if _one_of(choice, _TOOL_CHOICES):
        if choice != "none" and not has_tools:
            raise InvalidRequest("tool_choice is set but no tools are given", param="tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if not has_tools:
            raise InvalidRequest("tool_choice is set but no tools are given", param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise UnsupportedParameter(
        "Invalid 'tool_choice': expected 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidRequest("Invalid value for 'text': expected an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        schema = {"name": _field(fmt, "name", "text.format"), "schema": fmt.get("schema")}
        if not isinstance(schema["schema"], dict):
            raise InvalidRequest(
                "Invalid value for 'text.format.schema': expected an object", param="text.format.schema"
            )
        for optional in ("description", "strict"):
            if fmt.get(optional) is not None:
                schema[optional] = fmt[optional]
        return {"type": "json_schema", "json_schema": schema}
    raise UnsupportedParameter(
        "Invalid 'text.format.type': expected 'text', 'json_object' or 'json_schema'", param="text.format.type"
    )


def _reasoning_effort(reasoning: Any) -> str | None:
    if reasoning is None:
        return None
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else ...
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise InvalidRequest("Invalid value for 'reasoning.effort': expected a string", param="reasoning.effort")
    return effort


# What a response object repeats of its request, and the value when the request did not say.
ECHO_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "temperature": None,
    "top_p": None,
    "tool_choice": "auto",
    "tools": [],
    "text": {"format": {"type": "text"}},
    "max_output_tokens": None,
    "store": True,
    "background": False,
    "previous_response_id": None,
    "user": None,
    "truncation": "disabled",
    "reasoning": None,
}


def _echo(payload: dict[str, Any]) -> dict[str, Any]:
    return {name: payload.get(name) for name in ECHO_DEFAULTS if payload.get(name) is not None}
