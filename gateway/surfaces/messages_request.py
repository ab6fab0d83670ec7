"""An Anthropic Messages API request (`POST /v1/messages`), validated and turned into the kernel's form.

The kernel speaks chat completions, so the translation is total, as for the Responses API: every
parameter is mapped onto the chat request (`system` to a system message, content blocks to
messages, `tools` with `input_schema` to function tools, `tool_choice`, `stop_sequences`,
`max_tokens`, `temperature`, `top_p`, `top_k`, `metadata.user_id`), accepted as a hint with no
effect here (`_HINTS`), or refused with a 400 naming it.

Blocks: `text` in either role; an assistant's `tool_use` blocks become that turn's tool calls (the
input as JSON arguments); a user's `tool_result` blocks become tool messages, before the rest of
that turn's text. Images, documents and thinking blocks are refused: no backend here is known to
take them through this translation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest, UnsupportedParameter

# Accepted and not acted on: Anthropic's own service tiers and prompt-caching marks (which
# `cache_control` on blocks also is), and extended thinking, which a chat backend has no switch for.
_HINTS = frozenset({"service_tier", "thinking"})
_MAPPED = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "stream",
    }
)
_ROLES = frozenset({"user", "assistant"})


@dataclass(frozen=True, slots=True)
class TranslatedMessages:
    chat: dict[str, Any]  # the chat request the pipeline runs
    stream: bool


def translate(payload: Any) -> TranslatedMessages:
    if not isinstance(payload, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    for name in payload:
        if name not in _MAPPED and name not in _HINTS:
            raise UnsupportedParameter(f"{name}: Extra inputs are not permitted", param=name)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "a non-empty string")
    max_tokens = payload.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _invalid("max_tokens", "an integer of at least 1")
    stream = _typed(payload, "stream", bool) or False
    chat: dict[str, Any] = {"model": model, "messages": _messages(payload), "max_tokens": max_tokens, "stream": stream}
    if stream:
        chat["stream_options"] = {"include_usage": True}  # message_delta carries the usage
    tools = _tools(payload.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(payload.get("tool_choice"), chat)
    stops = payload.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _invalid("stop_sequences", "a list of strings")
        chat["stop"] = stops
    for name, kind in (("temperature", (int, float)), ("top_p", (int, float)), ("top_k", int)):
        value = _typed(payload, name, kind)
        if value is not None:
            chat[name] = value
    user = _user(payload.get("metadata"))
    if user is not None:
        chat["user"] = user
    return TranslatedMessages(chat, stream)


def _invalid(where: str, expected: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: expected {expected}", param=where, code="invalid_value")


def _typed(payload: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise InvalidRequest(f"{name}: invalid type", param=name, code="invalid_type")
    return value


def _user(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise _invalid("metadata", "an object")
    user = metadata.get("user_id")
    if user is not None and not isinstance(user, str):
        raise _invalid("metadata.user_id", "a string")
    return user


def _messages(payload: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = payload.get("system")
    if system is not None:
        text = _text_of(system, "system")
        if text:
            messages.append({"role": "system", "content": text})
    given = payload.get("messages")
    if not isinstance(given, list) or not given:
        raise _invalid("messages", "a non-empty list of messages")
    for index, message in enumerate(given):
        where = f"messages.{index}"
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise _invalid(f"{where}.role", "'user' or 'assistant'")
        messages += _turn(message["role"], message.get("content"), where)
    return messages


def _turn(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results first (each its own tool message),
    then the text, and an assistant's tool uses as its tool calls."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _invalid(f"{where}.content", "a string or a list of content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}.content.{index}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_call(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_result(block, at))
        else:
            raise UnsupportedParameter(
                f"{at}: content blocks of type {kind!r} are not supported here in the {role} role: use 'text', "
                "'tool_use' (assistant) and 'tool_result' (user)",
                param=f"{at}.type",
            )
    turn: list[dict[str, Any]] = list(results)
    if calls:
        turn.append({"role": "assistant", "content": "\n".join(texts) or None, "tool_calls": calls})
    elif texts or not results:
        turn.append({"role": role, "content": "\n".join(texts)})
    return turn


def _call(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise _invalid(at, "a tool_use block with a string 'id' and 'name'")
    if not isinstance(arguments, dict):
        raise _invalid(f"{at}.input", "an object")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def _result(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"{at}.tool_use_id", "a string")
    content = block.get("content", "")
    text = _text_of(content, f"{at}.content")
    if block.get("is_error") is True:
        text = f"Error: {text}"  # the chat form has no flag for it: the model reads it in the text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _text_of(content: Any, where: str) -> str:
    """A string, or text blocks (joined); any other block is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(where, "a string or a list of text blocks")
    texts = []
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise UnsupportedParameter(
                f"{where}.{index}: content blocks of type {kind!r} are not supported here: only 'text'",
                param=f"{where}.{index}.type",
            )
        texts.append(block["text"])
    return "\n".join(texts)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _invalid("tools", "a list")
    converted = []
    for index, tool in enumerate(tools):
        where = f"tools.{index}"
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise UnsupportedParameter(
                f"{where}: tools of type {kind!r} are not supported: only client tools (name, input_schema), "
                "whose calls are returned to the agent or run at the gateway's MCP endpoint",
                param=f"{where}.type",
            )
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _invalid(f"{where}.name", "a non-empty string")
        if not isinstance(schema, dict):
            raise _invalid(f"{where}.input_schema", "an object (a JSON Schema)")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "any", "tool") and "tools" not in chat:
        raise InvalidRequest("tool_choice: set, but no tools are given", param="tool_choice")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise UnsupportedParameter(
            "tool_choice: expected {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
            param="tool_choice",
        )
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
