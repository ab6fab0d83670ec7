"""The kernel's own types: what every surface, stage, the router and every backend speak.

A chunk is one streaming delta of an answer, normalized across providers; usage sums what an
answer cost. They import nothing of the gateway, so any layer may use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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

    def text_pieces(self) -> tuple[str, ...]:
        """The texts to send as one event each: a joined chunk's pieces (coalesce.py), unless a stage
        rewrote its content since, else its content whole; none without content."""
        if not self.content:
            return ()
        return self.pieces if self.pieces and "".join(self.pieces) == self.content else (self.content,)

    @property
    def carries_output(self) -> bool:
        """True once the model has produced something: the point after which a retry is visible."""
        return bool(self.content or self.reasoning or self.tool_calls or self.finish_reason)
