"""An answer folded from its chunks: the kernel's form of what the model said, whatever surface
renders it (a collected body, a session's transcript)."""

from __future__ import annotations

from typing import Any

from gateway.core.chunks import Chunk


class Answer:
    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        # Fields the kernel does not interpret, passed on to the client untouched (Chunk's extras).
        self.message_extra: dict[str, Any] = {}
        self.choice_extra: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
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
            self.message_extra.update(chunk.delta_extra)
        if chunk.choice_extra:
            self.choice_extra.update(chunk.choice_extra)
        if chunk.extra:
            self.extra.update(chunk.extra)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason

    @property
    def content(self) -> str | None:
        """The text, or None when the model wrote none (only tool calls, say)."""
        return "".join(self._content) if self._content else None

    @property
    def reasoning(self) -> str | None:
        return "".join(self._reasoning) if self._reasoning else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """In OpenAI's form (`id`, `type`, `function` with `name` and `arguments`), by index."""
        return [self._tool_calls[i] for i in sorted(self._tool_calls)]

    def message(self, resumed: tuple[str, int] | None = None) -> dict[str, Any]:
        """The assistant message, for a transcript; `resumed` text (a takeover) goes in front."""
        content = (resumed[0] if resumed else "") + (self.content or "")
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if self._tool_calls:
            message["tool_calls"] = self.tool_calls
        return message
