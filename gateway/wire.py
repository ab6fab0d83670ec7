"""The OpenAI chat-completions wire format as upstreams speak it.

`chunk_from_openai` reads an upstream `chat.completion.chunk` into the kernel's `Chunk`; fields we
do not interpret travel in the chunk's `*_extra` dicts and come out where they went in (the Chat
Completions surface, gateway/surfaces/chat_completions.py, writes them back).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.chunks import Chunk, ToolCallDelta, Usage

_DELTA_KNOWN = frozenset({"role", "content", "reasoning_content", "reasoning", "tool_calls"})
_CHOICE_KNOWN = frozenset({"index", "delta", "finish_reason", "message"})
_CHUNK_KNOWN = frozenset({"id", "object", "created", "model", "choices", "usage"})
_USAGE_KNOWN = frozenset({"prompt_tokens", "completion_tokens", "total_tokens"})
# No request comes near this many tokens (10**12); a figure past it is a broken upstream.
MAX_TOKEN_COUNT = 10**12
# A chunk and its choice with these fields at most may be plain text (`plain_text`).
_PLAIN_CHUNK = frozenset({"id", "object", "created", "model", "choices"})
_PLAIN_CHOICE = frozenset({"index", "delta", "finish_reason", "logprobs"})


def plain_text(payload: dict[str, Any]) -> str | None:
    """The text of a chunk that carries nothing but text for choice 0, else None.

    Most of an answer's chunks are such, and they need no `Chunk` of their own: the text of the
    ones that arrive together travels as one (backends/coalesce.py). Anything else (usage, a role,
    a finish, logprobs, a field the gateway does not interpret, a malformed shape) is None and
    goes through `chunk_from_openai`. Counted under callgrind: ~7k instructions a chunk against ~23k.
    """
    if not _PLAIN_CHUNK.issuperset(payload):
        return None
    choices = payload.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or not _PLAIN_CHOICE.issuperset(choice):
        return None
    if choice.get("index", 0) != 0 or choice.get("finish_reason") is not None or choice.get("logprobs") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None
    text = delta.get("content")
    return text if type(text) is str and text else None


def chunk_from_openai(payload: dict[str, Any]) -> Chunk:
    """Normalize one upstream chunk. Raises AttributeError/KeyError/TypeError/ValueError on a malformed one."""
    # Every chunk that is not plain text passes here (`plain_text` takes the rest). Fields the
    # gateway does not interpret are copied only when `issuperset` (cheaper than a key set
    # difference) says there are any, in the upstream's order (a set's order changes from one
    # process to the next).
    chunk = Chunk() if _CHUNK_KNOWN.issuperset(payload) else Chunk(extra=_unknown(payload, _CHUNK_KNOWN))
    usage = payload.get("usage")
    if usage:
        chunk.usage = usage_from_openai(usage)
    for choice in payload.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue  # n>1 is refused at the edge; a stray choice is not ours to forward
        delta = choice.get("delta") or {}
        if "function_call" in delta:
            # Never asked for (the legacy API is refused at the edge), and it would pass the tool
            # policy by: a malformed answer, like any other.
            raise ValueError("legacy function_call in the answer")
        chunk.role = delta.get("role")
        chunk.content = delta.get("content")
        chunk.reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        tool_calls = delta.get("tool_calls")
        chunk.tool_calls = [_tool_call_delta(t) for t in tool_calls] if tool_calls else []
        chunk.finish_reason = choice.get("finish_reason")
        for text in (chunk.role, chunk.content, chunk.reasoning, chunk.finish_reason):
            if text is not None and not isinstance(text, str):
                # Joined, rendered and hashed as text further on: a bug's TypeError there otherwise.
                raise TypeError("a delta's role, content or reasoning, or the finish_reason, is not a string")
        chunk.delta_extra = {} if _DELTA_KNOWN.issuperset(delta) else _unknown(delta, _DELTA_KNOWN)
        chunk.choice_extra = (
            {}
            if _CHOICE_KNOWN.issuperset(choice)
            else {k: v for k, v in _unknown(choice, _CHOICE_KNOWN).items() if v is not None}
        )
    return chunk


def _unknown(fields: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """The fields not in `known`, in their order."""
    return {k: v for k, v in fields.items() if k not in known}


def usage_from_openai(usage: dict[str, Any]) -> Usage:
    """The upstream's usage; an untrusted, empty one when a figure is not a count a real answer
    can have, or a breakdown will not encode (a 2**64 in `prompt_tokens_details`)."""
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    total = _count(usage.get("total_tokens")) if usage.get("total_tokens") else (prompt or 0) + (completion or 0)
    extra = {k: v for k, v in usage.items() if k not in _USAGE_KNOWN}
    if prompt is None or completion is None or total is None or not _encodes(extra):
        return Usage(trusted=False)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total, extra=extra)


def _count(value: Any) -> int | None:
    """A token count as reported (absent is 0), or None for one that cannot be."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        return None
    return value


def _encodes(extra: dict[str, Any]) -> bool:
    try:
        orjson.dumps(extra)
    except orjson.JSONEncodeError:
        return False
    return True


def _tool_call_delta(raw: Any) -> ToolCallDelta:
    if not isinstance(raw, dict):
        raise TypeError("a tool_calls entry is not an object")
    function = raw.get("function") or {}
    if not isinstance(function, dict):
        raise TypeError("a tool call's function is not an object")
    name, arguments, call_id = function.get("name"), function.get("arguments") or "", raw.get("id")
    if not (isinstance(name, str | None) and isinstance(arguments, str) and isinstance(call_id, str | None)):
        raise TypeError("a tool call's id, name or arguments is not a string")
    return ToolCallDelta(index=int(raw.get("index", 0)), id=call_id, name=name, arguments=arguments)


def dumps(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload)
