"""The OpenAI chat-completions wire format, in and out.

`chunk_from_openai` reads an upstream `chat.completion.chunk`; `ChunkRenderer` writes the client's
chunks under the gateway's completion id and the client's model name; `Completion` folds a chunk
stream into one non-streaming `chat.completion`. Fields we do not interpret travel in the chunk's
`*_extra` dicts and come out where they went in.
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


class Completion:
    """Folds a chunk stream into one `chat.completion` body."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._message_extra: dict[str, Any] = {}
        self._choice_extra: dict[str, Any] = {}
        self._extra: dict[str, Any] = {}
        self.finish_reason: str | None = None

    def add(self, chunk: Chunk) -> None:
        if chunk.content:
            self._content.append(chunk.content)
        if chunk.reasoning:
            self._reasoning.append(chunk.reasoning)
        for delta in chunk.tool_calls:
            call = self._tool_calls.setdefault(
                delta.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            call.update(delta.extra)
            if delta.id:
                call["id"] = delta.id
            if delta.name:
                call["function"]["name"] += delta.name
            call["function"]["arguments"] += delta.arguments
        if chunk.delta_extra:
            self._message_extra.update(chunk.delta_extra)
        if chunk.choice_extra:
            self._choice_extra.update(chunk.choice_extra)
        if chunk.extra:
            self._extra.update(chunk.extra)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason

    @property
    def content(self) -> str:
        return "".join(self._content)

    def message(self, resumed: tuple[str, int] | None = None) -> dict[str, Any]:
        """The assistant message, for a transcript; `resumed` text (a takeover) goes in front."""
        content = (resumed[0] if resumed else "") + self.content
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
        return message

    def render(self, completion_id: str, created: int, model: str, usage: Usage | None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content if self._content else None}
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
        message.update(self._message_extra)
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}
        choice.update(self._choice_extra)
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            **self._extra,
            "choices": [choice],
        }
        if usage is not None:
            body["usage"] = usage.to_dict()
        return body


def dumps(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload)
