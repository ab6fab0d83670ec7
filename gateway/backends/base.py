"""The backend seam: one request in, an async stream of normalized chunks out.

Every upstream call goes through `Backend.stream`. A backend translates its transport's failures
into `gateway.errors.UpstreamError` subclasses; the router never sees httpx or litellm exceptions.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # added by the gateway: approval id and token


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # Provider-specific breakdowns (cached tokens, reasoning tokens) pass through untouched.
    extra: dict[str, Any] = field(default_factory=dict)
    # The partial answer a continuation resent as prompt: its cost, kept out of `prompt_tokens`
    # (the client's own prompt) and out of what the client is shown and billed.
    continuation_prompt_tokens: int = 0
    # False once an upstream reported figures no answer can have (negative, fractional, past any
    # size): the gateway's own count stands in for them (gateway/tokens.py).
    trusted: bool = True

    def __iadd__(self, other: Usage) -> Usage:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.total_tokens += other.total_tokens
        self.extra = {**self.extra, **other.extra}
        self.continuation_prompt_tokens += other.continuation_prompt_tokens
        self.trusted = self.trusted and other.trusted
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass(slots=True)
class Chunk:
    """One streaming delta of choice 0, normalized across providers.

    The normalized fields are authoritative; `delta_extra`, `choice_extra` and `extra` carry fields
    we do not interpret (logprobs, system_fingerprint, provider fields) so that they reach the
    client untouched.
    """

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    # Completion tokens of this answer so far, when the upstream says so on every chunk (vLLM's
    # continuous usage stats); a chunk may carry several tokens, so counting chunks undercounts.
    tokens: int | None = None
    # Plain content chunks that arrived in one read travel as one (coalesce.py): these are their
    # contents, one streamed event each. Empty for a chunk as the upstream sent it.
    pieces: tuple[str, ...] = ()
    delta_extra: dict[str, Any] = field(default_factory=dict)
    choice_extra: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def carries_output(self) -> bool:
        """True once the model has produced something: the point after which a retry is visible."""
        return bool(self.content or self.reasoning or self.tool_calls or self.finish_reason)


@dataclass(frozen=True, slots=True)
class BackendRequest:
    """An OpenAI chat-completions body already addressed to one deployment (its model name)."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class Backend(Protocol):
    """One deployment's transport. Implementations: OpenAI-compatible over httpx, litellm."""

    name: str

    def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        """Yield chunks until the upstream finishes; raise `UpstreamError` on any failure.

        The stream ends normally only when the upstream signalled completion ([DONE] or
        equivalent): a cut connection is an error, never a short answer.
        """
        ...

    async def probe(self) -> None:
        """Cheap liveness check for active health probes; raise `UpstreamError` if unhealthy."""
        ...

    def cut_idle(self, idle_s: float) -> int:
        """End every wait of this backend's streams that has had no data for `idle_s` with a
        retryable `UpstreamTimeout` (its breaker just opened on a stall); how many were cut."""
        ...

    async def aclose(self) -> None: ...
