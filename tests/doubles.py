"""Test doubles for the backend seam (unit tests only; end-to-end tests use real sim processes)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from gateway.backends.base import BackendRequest
from gateway.core.chunks import Chunk, ToolCallDelta, Usage
from gateway.errors import UpstreamError


@dataclass
class Script:
    """What one call does: emit `tokens`, then raise `error` (if any) after `fail_after` tokens."""

    tokens: list[str] = field(default_factory=lambda: ["Hello", " world"])
    error: UpstreamError | None = None
    fail_after: int = 0


class ScriptedBackend:
    def __init__(self, name: str, *scripts: Script, clock_step: Callable[[], None] | None = None) -> None:
        self.name = name
        self._scripts = list(scripts)
        self.requests: list[BackendRequest] = []
        self.probe_error: UpstreamError | None = None
        self.prelude: list[Chunk] = []  # sent after the role chunk, before the tokens
        self._clock_step = clock_step

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        self.requests.append(request)
        script = self._scripts.pop(0) if len(self._scripts) > 1 else self._scripts[0]
        yield Chunk(role="assistant", content="")
        for early in self.prelude:  # copies: the gateway may change the chunks it is given
            calls = [ToolCallDelta(t.index, t.id, t.name, t.arguments) for t in early.tool_calls]
            yield Chunk(content=early.content, tool_calls=calls, finish_reason=early.finish_reason, tokens=early.tokens)
        for i, token in enumerate(script.tokens):
            if script.error is not None and i == script.fail_after:
                raise script.error
            if self._clock_step is not None:
                self._clock_step()
            yield Chunk(content=token)
        if script.error is not None and script.fail_after >= len(script.tokens):
            raise script.error
        yield Chunk(finish_reason="stop")
        n = len(script.tokens)
        yield Chunk(usage=Usage(prompt_tokens=3, completion_tokens=n, total_tokens=3 + n))

    async def probe(self) -> None:
        if self.probe_error is not None:
            raise self.probe_error

    def cut_idle(self, idle_s: float) -> int:
        return 0

    async def aclose(self) -> None:
        return None
