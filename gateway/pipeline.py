"""The request path: a short list of stages, each wrapping the rest of the path.

A stage is called with the request context and the next handler and returns the chunk stream,
so one interface covers stages that act before the call (auth, quota, policy), around it
(settle, audit) and on each chunk (metering, response policy). Nothing runs until the first
chunk is pulled; an error raised before the first chunk becomes an HTTP error response, one
raised later an in-band error event. The non-streaming response is this same stream, collected.

`compose` builds the path once, in `gateway.app`, from the list there.

The release invariant: a stage that reserves something (an audit slot, a quota reservation and
its lease, a heartbeat task, a trace span) releases it in a `finally` around its `call_next`, so
it is released on every exit - a normal end, a `GatewayError`, any other exception (a bug), the
client going away (`GeneratorExit` / cancellation) - and the release itself must not raise. So
is the audit stage's record: it is written on every exit, and if the full record cannot be built,
a minimal one naming the failure is written instead; no request goes unaudited. Input that could
make a release fail (JSON deeper than the encoder's limit) is refused by `ParseRequest` before
any quota is taken. `tests/security/test_stage_release.py` injects a failure at each stage and
checks that nothing stays reserved.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from gateway.core.chunks import Chunk, Usage
from gateway.core.principal import Principal
from gateway.core.route_log import RouteLog
from gateway.core.surface import Continuity, Surface
from gateway.routing.router import Router
from gateway.routing.trace import RouteTrace, UntracedRoute
from gateway.settings import Operation
from gateway.store.release_record import Release
from gateway.store.session_record import QuotaHold
from gateway.tokens import counted, estimate_prompt_tokens, floor_tokens, output_characters

Handler = Callable[["RequestContext"], AsyncGenerator[Chunk, None]]


class _HasStatus(Protocol):
    @property
    def status(self) -> str: ...


Decided = TypeVar("Decided", bound=_HasStatus)


class Trace(RouteTrace, Protocol):
    """What the stages report about one request, beyond the router's attempts. Telemetry's
    `RequestTrace` implements it; the pipeline and the stages know only this."""

    def quota_rejected(self, limit: str, scope: str, retry_after_s: float) -> None: ...

    def approval_requested(self, approval_id: str, tool: str, mode: str) -> None: ...

    async def approval_wait(self, approval_id: str, tool: str, wait: Awaitable[Decided]) -> Decided:
        """Await a person's decision (anything with a `status`), counted as pending meanwhile."""
        ...


class Untraced(UntracedRoute):
    """The trace of a context made without the tracing stage: hears nothing."""

    __slots__ = ()

    def quota_rejected(self, limit: str, scope: str, retry_after_s: float) -> None:
        return None

    def approval_requested(self, approval_id: str, tool: str, mode: str) -> None:
        return None

    async def approval_wait(self, approval_id: str, tool: str, wait: Awaitable[Decided]) -> Decided:
        return await wait


@dataclass(slots=True)
class RequestContext:
    """Everything known about one request. Each field has one writer, named in the section above
    it; every other stage only reads it (tests/test_pipeline.py holds this for gateway/). Two
    fields are shared on purpose: `body` is rewritten in stage order (ParseRequest parses it,
    AppendHistory puts the session's history in front, ApplyRelease the release's system prompt,
    ToolPolicy strips tools, Admit sets the reserved max_tokens), each stage seeing what the
    earlier ones made; `response_headers` collects each stage's own headers, sent by the HTTP
    layer with the first chunk."""

    # The HTTP layer (http/openai_api.py), or a session reader taking a session over
    # (sessions/resume.py), when it builds the context.
    request_id: str
    completion_id: str
    surface: Surface  # the API the client speaks: parses its request, writes its answer and errors
    client: str = ""  # the peer's address, for aggregating refusals by source
    headers: Mapping[str, str] = field(default_factory=dict)
    read_body: Callable[[], Awaitable[bytes]] | None = None  # the raw body, read by ParseRequest
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    resume: tuple[str, int] | None = None  # (text, chunks) already sent, when taking a session over
    resumed_events: tuple[bytes, ...] = ()  # the event payloads already sent, then (the surface's)
    response_headers: dict[str, str] = field(default_factory=dict)

    # ParseRequest (http/requests.py), from what `surface` parsed; `body` shared as above.
    model: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    echo: Mapping[str, Any] = field(default_factory=dict)  # the surface's, for its answer (ParsedRequest.echo)
    continuity: Continuity | None = None  # the kept answers it continues and makes (ParsedRequest.continuity)
    operation: Operation = Operation.CHAT  # what the deployments are asked (ParsedRequest.operation)

    # TraceRequests (telemetry/stage.py).
    trace: Trace = field(default_factory=Untraced)  # inert without the tracing stage

    # Authenticate (auth/stage.py), or ActAs there for an operator's pinned request.
    principal: Principal | None = None

    # AssignSession (sessions/stage.py).
    session_id: str | None = None
    session_owner: str | None = None  # the key id owning the session (None: this request's key)
    session_shared: bool = False  # the session is open to every key of its tenant
    keep_transcript: bool = False  # opted in (X-Session-Id, or config): the prompts and answers are stored
    session_new: bool = False  # the id was made here (no X-Session-Id): no store holds it yet
    # AppendHistory: the store was down (sessions.on_store_error: serve_unresumable), so this
    # answer is served without a checkpoint and nothing of it is written to the session.
    session_unresumable: bool = False
    # AppendHistory, for an answer kept as an object (Continuity.store): the conversation it ends
    # (the continued answers' and this request's messages, without instructions) and its input
    # items in the surface's form (the continued answers' input and output, then this request's).
    conversation: tuple[dict[str, Any], ...] | None = None
    kept_items: tuple[dict[str, Any], ...] = ()

    # Admit (quota/stage.py).
    estimated_prompt_tokens: int = 0
    quota_note: str | None = None  # set when quotas were not enforced (store down, fail-open)
    # The quota reservation this request holds (quota.Admit's JSON form): saved with a session,
    # so that a replica taking the session over settles it instead of taking a second one.
    quota_hold: QuotaHold | None = None

    # ApplyRelease and CanaryFallback (releases/stage.py).
    release: str | None = None  # the model's active release when the request started
    deployments: frozenset[str] | None = None  # the release's deployments; None: all of the model's
    # A canary request: the active release it falls back to if the candidate fails before output.
    release_fallback: Release | None = None
    release_prompt: str = ""  # the system prompt the release put in front
    canary_failed: bool = False

    # ToolPolicy (approvals/tool_policy.py): while a tool call waits for a person, a non-streamed
    # answer sends whitespace this often.
    approval_keepalive_s: float | None = None

    # Meter (here) and the router behind Call (the route log).
    route: RouteLog = field(default_factory=RouteLog)
    usage: Usage = field(default_factory=Usage)
    ttft_s: float | None = None
    relayed_tokens: int = 0  # the gateway's own floor count of the output it passed on (tokens.py)

    # Admit, when the request was metered: what the quota was settled with.
    charged_tokens: int | None = None

    # AuditRequests (audit/stage.py): the assistant text, for the record's digests.
    completion_text: list[str] = field(default_factory=list)


class Stage(Protocol):
    def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]: ...


def compose(stages: Sequence[Stage], terminal: Handler) -> Handler:
    """Chain stages so that the first in the list is the outermost."""
    handler = terminal
    for stage in reversed(stages):
        handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, call_next: Handler) -> Handler:
    def handler(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
        return stage(ctx, call_next)

    return handler


class Meter:
    """Sums usage over every attempt, keeps it off the content stream, times the first token, and
    counts what it relays: the floor under the usage the upstream reports (gateway/tokens.py).

    The HTTP layer sends `ctx.usage` as the final chunk when the client asked for usage.
    """

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        events = characters = 0
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    if chunk.usage is not None:
                        ctx.usage += chunk.usage
                        chunk.usage = None
                    if chunk.content or chunk.reasoning or chunk.tool_calls:
                        events += len(chunk.pieces) or 1
                        characters += output_characters(chunk)
                    if ctx.ttft_s is None and chunk.carries_output:
                        ctx.ttft_s = time.monotonic() - ctx.started
                    yield chunk
        finally:
            # Counted once, on every exit: the quota stage outside settles with it.
            ctx.relayed_tokens = max(events, floor_tokens(characters))
        # Before the HTTP layer renders it: the client is shown what it is billed.
        estimate = ctx.estimated_prompt_tokens or estimate_prompt_tokens(ctx.body)
        ctx.usage = counted(ctx.usage, estimate, ctx.relayed_tokens)


class Call:
    """The end of the path: the router picks deployments and streams from them."""

    def __init__(self, router: Router) -> None:
        self._router = router

    def __call__(self, ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
        return self._router.stream(
            ctx.model,
            ctx.body,
            ctx.route,
            resume=ctx.resume,
            trace=ctx.trace,
            allowed=ctx.deployments,
            operation=ctx.operation,
        )
