"""What the client has been sent, and how another deployment can carry on from there.

`StreamProgress` sits between the upstream chunks and the client. It records the assistant text
already sent and holds tool-call deltas back until each call is complete, so that a failure in
the middle of a tool call never leaves half a call with the client: the buffered half is dropped
and the fallback generates the call again. When the upstream fails mid-stream, `request_for`
builds the continuation for the next deployment's kind:

- vllm (vLLM, SGLang): the partial answer as a final assistant message, with
  `continue_final_message: true, add_generation_prompt: false`;
- prefill (llama.cpp, Anthropic through litellm): the partial answer as a trailing assistant
  message, which these servers continue;

and shrinks `max_tokens` by what was already sent, since those servers count only new tokens.
What cannot be continued: an answer that already sent tool calls or reasoning (no server can
resume those mid-way); the stream then ends with an in-band error.
"""

from __future__ import annotations

from typing import Any

from gateway.core.chunks import Chunk, ToolCallDelta, Usage
from gateway.errors import UpstreamError
from gateway.settings import Continuation, DeploymentSettings, Operation
from gateway.tokens import CHARS_PER_TOKEN_FLOOR, floor_tokens, output_characters

_TOKEN_LIMITS = ("max_completion_tokens", "max_tokens")


class Interrupted(Exception):
    """An attempt failed after output reached the client (internal to routing)."""

    def __init__(self, cause: UpstreamError, deployment: str, output_chunks: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.deployment = deployment
        self.output_chunks = output_chunks


class StreamProgress:
    def __init__(
        self,
        body: dict[str, Any],
        resume: tuple[str, int] | None = None,
        allowed: frozenset[str] | None = None,
        operation: Operation = Operation.CHAT,
    ) -> None:
        self._body = body
        self._allowed = allowed  # the active release's deployments
        self.operation = operation
        text, chunks = resume or ("", 0)
        self._text: list[str] = [text] if text else []
        # Tokens sent, the max_tokens unit: as the upstream counts them when it says (Chunk.tokens),
        # else one a content chunk.
        self.content_chunks = chunks
        self._attempt_base = chunks  # tokens sent before the current attempt started
        self.started = resume is not None  # the client has received output
        self._sent_role = resume is not None
        self._sent_tool_calls = False
        self._sent_reasoning = False
        self._pending: dict[int, ToolCallDelta] = {}
        limits = [body[k] for k in _TOKEN_LIMITS if isinstance(body.get(k), int)]
        self._limit: int | None = min(limits) if limits else None
        self._characters = 0  # of output sent, for the floor count (gateway/tokens.py)
        self._carried = 0  # tokens of partial answer the current attempt was sent as prompt
        self.overran = False  # the upstream wrote past the limit: the answer was ended here

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def continuable(self) -> bool:
        return not (self._sent_tool_calls or self._sent_reasoning)

    @property
    def budget_spent(self) -> bool:
        """Every token `max_tokens` allowed was sent: the answer is whole, only its end was lost."""
        limits = [self._body[k] for k in _TOKEN_LIMITS if isinstance(self._body.get(k), int)]
        return bool(limits) and self.content_chunks >= min(limits)

    def can_serve(self, deployment: DeploymentSettings) -> bool:
        """May this deployment produce (the rest of) the answer? It must belong to the request's
        release; any may start an answer, only one that can continue may finish one."""
        if self._allowed is not None and deployment.name not in self._allowed:
            return False
        if self.operation not in deployment.serves:
            return False
        return not self._text or deployment.continuation is not Continuation.NONE

    def begin_attempt(self) -> None:
        self._attempt_base = self.content_chunks
        self._carried = self.content_chunks if self._text else 0

    def request_for(self, deployment: DeploymentSettings) -> dict[str, Any]:
        """The body to send `deployment` so that its answer starts where the client is."""
        if not self._text:
            return self._body
        partial = {"role": "assistant", "content": self.text}
        body = {**self._body, "messages": [*self._body["messages"], partial]}
        if deployment.continuation is Continuation.VLLM:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        for limit in _TOKEN_LIMITS:
            if isinstance(body.get(limit), int):
                body[limit] = max(1, body[limit] - self.content_chunks)
        return body

    def admit(self, chunk: Chunk) -> Chunk | None:
        """The chunk to pass on (possibly with completed tool calls instead of deltas), or None."""
        if self._limit is not None and (chunk.content or chunk.reasoning or chunk.tool_calls):
            self._hold_to_limit(chunk, self._limit)
        if chunk.usage is not None and self._carried:
            _bill_separately(chunk.usage, self._carried)
        if chunk.role is not None:
            if self._sent_role:
                chunk.role = None  # a continuation's own role chunk: the client already has one
            self._sent_role = True
        if chunk.tool_calls:
            chunk.tool_calls = self._buffer(chunk.tool_calls)
        if chunk.finish_reason is not None:
            chunk.tool_calls += self._release(None)
        if chunk.content:
            self._text.append(chunk.content)
        if chunk.tokens is not None:
            self.content_chunks = max(self.content_chunks, self._attempt_base + chunk.tokens)
        elif chunk.content:
            self.content_chunks += 1
        self._sent_reasoning = self._sent_reasoning or bool(chunk.reasoning)
        self._sent_tool_calls = self._sent_tool_calls or bool(chunk.tool_calls)
        if not (chunk.carries_output or chunk.role or chunk.usage or chunk.delta_extra or chunk.choice_extra):
            return None
        self.started = self.started or chunk.carries_output
        return chunk

    def _hold_to_limit(self, chunk: Chunk, limit: int) -> None:
        """Keep the answer within `limit` tokens by the gateway's floor count: an upstream that
        writes past it (it was asked for no more) has its answer ended here, as "length"."""
        events = (len(chunk.pieces) or 1) if chunk.content else 0
        size = output_characters(chunk)
        if max(self.content_chunks + events, floor_tokens(self._characters + size)) <= limit:
            self._characters += size
            return
        room = max(0, limit - self.content_chunks)  # more events than this would overrun the count
        allowed = max(0, limit * CHARS_PER_TOKEN_FLOOR - self._characters)
        pieces = chunk.pieces or ((chunk.content,) if chunk.content else ())
        kept: list[str] = []
        for piece in pieces[:room]:
            kept.append(piece[:allowed])
            allowed -= len(kept[-1])
        chunk.content = "".join(kept) or None
        chunk.pieces = tuple(kept) if chunk.pieces else ()
        chunk.reasoning = (chunk.reasoning or "")[:allowed] or None
        chunk.tool_calls, chunk.tokens = [], None  # a call cut short is never sent
        self._pending.clear()
        self._characters += output_characters(chunk)
        chunk.finish_reason = "length"
        self.overran = True

    def flush(self) -> Chunk | None:
        """Tool calls still held when the upstream finished without a finish_reason."""
        calls = self._release(None)
        if not calls:
            return None
        self._sent_tool_calls = True
        return Chunk(tool_calls=calls)

    def discard_pending(self) -> None:
        """The attempt failed: half-received tool calls are never sent."""
        self._pending.clear()

    def _buffer(self, deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
        complete: list[ToolCallDelta] = []
        for delta in deltas:
            # Calls stream one after another: a delta for index i completes every call before it.
            complete += self._release(delta.index)
            held = self._pending.get(delta.index)
            if held is None:
                self._pending[delta.index] = ToolCallDelta(delta.index, delta.id, delta.name, delta.arguments)
                continue
            held.id = held.id or delta.id
            held.name = (held.name or "") + (delta.name or "") if delta.name else held.name
            held.arguments += delta.arguments
        return complete

    def _release(self, below: int | None) -> list[ToolCallDelta]:
        ready = sorted(i for i in self._pending if below is None or i < below)
        return [self._pending.pop(i) for i in ready]


def _bill_separately(usage: Usage, carried: int) -> None:
    """A continuation's prompt holds the partial answer: that part is the continuation's cost,
    not the client's prompt (which the tenant would otherwise pay for twice)."""
    moved = min(carried, usage.prompt_tokens)
    usage.prompt_tokens -= moved
    usage.total_tokens -= moved
    usage.continuation_prompt_tokens += moved
