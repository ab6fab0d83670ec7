"""One request's trace: its server span, and what the stages and the router report to it.

The `TraceRequests` stage puts a `RequestTrace` on the RequestContext (a context made without it
carries the pipeline's inert `Untraced`). Built without telemetry it is inert too: reports are
no-ops and attempts carry no trace headers.

Spans are started and ended explicitly and never made current across a `yield`: a response
stream is pulled first by the HTTP handler's task and then by a session producer task, and a
context attached in one task cannot be detached in the other. The pipeline stage
(`telemetry/stage.py`) makes the server span current only while each chunk is pulled.

Prompts and completions never go into spans: only sizes, names, ids and outcomes do.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, StatusCode

from gateway.errors import UpstreamStatusError
from gateway.pipeline import Decided

if TYPE_CHECKING:
    from gateway.core.route_log import Attempt
    from gateway.routing.deployment import Deployment
    from gateway.telemetry.providers import Attributes, DeploymentTelemetry, Telemetry

_SERVER_ATTRIBUTES: dict[str, str] = {
    "gen_ai.operation.name": "chat",
    "http.request.method": "POST",
    "http.route": "/v1/chat/completions",
}


def max_tokens_of(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens") or body.get("max_tokens")
    return value if isinstance(value, int) else None


class RequestTrace:
    __slots__ = ("_telemetry", "context", "finish_reason", "span")

    def __init__(self, telemetry: Telemetry | None = None, span: Span = INVALID_SPAN) -> None:
        self._telemetry = telemetry
        self.span = span
        self.context = Context() if telemetry is None else trace.set_span_in_context(span)
        self.finish_reason: str | None = None

    @property
    def traced(self) -> bool:
        """A span of ours, or a client's trace carried through: something to put on attempts."""
        return self.span.get_span_context().is_valid

    @classmethod
    def start(cls, telemetry: Telemetry, name: str, headers: Mapping[str, str]) -> RequestTrace:
        """A SERVER span that continues the client's W3C trace context (`traceparent`, `tracestate`)."""
        if not telemetry.records_spans and "traceparent" not in headers:
            # No span to make and no trace to continue: skip the no-op work (2% of a request's
            # instructions, spans and propagation together); metrics are recorded all the same.
            return cls(telemetry)
        parent = telemetry.propagator.extract(headers)
        span = telemetry.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=_SERVER_ATTRIBUTES)
        return cls(telemetry, span)

    def attempt(
        self, model: str, deployment: Deployment, attempt: Attempt, number: int, body: Mapping[str, Any]
    ) -> AttemptTrace:
        return AttemptTrace(self._telemetry, self.context, model, deployment, attempt, number, body, self.traced)

    def retry(self, deployment: str, reason: str, number: int) -> None:
        """Another attempt, before any output: `reason` is why the previous one failed."""
        attributes: Attributes = {
            "gateway.deployment": deployment,
            "gateway.failure_reason": reason,
            "gateway.attempt": number,
        }
        self.span.add_event("gateway.retry", attributes)

    def failover(self, deployment: str, reason: str, output_chunks: int, count: int) -> None:
        """A mid-stream hand-over: `deployment` failed after output and another one continues."""
        attributes: Attributes = {
            "gateway.deployment": deployment,
            "gateway.failure_reason": reason,
            "gateway.output_chunks": output_chunks,
            "gateway.failovers": count,
        }
        self.span.add_event("gateway.failover", attributes)

    def quota_rejected(self, limit: str, scope: str, retry_after_s: float) -> None:
        # The scope label is "key" or "tenant", never the key id: one series per key would grow without bound.
        attributes: Attributes = {
            "gateway.quota.limit": limit,
            "gateway.quota.scope": "tenant" if scope == "tenant" else "key",
        }
        self.span.add_event("gateway.quota.rejected", {**attributes, "gateway.retry_after_s": retry_after_s})
        if self._telemetry is not None:
            self._telemetry.instruments.quota_rejections.add(1, attributes)

    def approval_requested(self, approval_id: str, tool: str, mode: str) -> None:
        attributes: Attributes = {
            "gateway.approval_id": approval_id,
            "gen_ai.tool.name": tool,
            "gateway.approval_mode": mode,
        }
        self.span.add_event("gateway.approval.requested", attributes)

    async def approval_wait(self, approval_id: str, tool: str, wait: Awaitable[Decided]) -> Decided:
        """Await a person's decision, counted as pending meanwhile; returns the decided approval."""
        pending = self._telemetry.instruments.approvals_pending if self._telemetry is not None else None
        self.span.add_event("gateway.approval.wait", {"gateway.approval_id": approval_id, "gen_ai.tool.name": tool})
        started = time.monotonic()
        status = "abandoned"
        if pending is not None:
            pending.add(1)
        try:
            decided = await wait
            status = decided.status
            return decided
        finally:
            if pending is not None:
                pending.add(-1)
            waited = time.monotonic() - started
            decision: Attributes = {
                "gateway.approval_id": approval_id,
                "gateway.approval_status": status,
                "gateway.waited_s": waited,
            }
            self.span.add_event("gateway.approval.decided", decision)


class AttemptTrace:
    """One upstream attempt: a CLIENT span under the request's span, and its latency metrics.

    Used as a context manager around the attempt. `headers` carry the attempt's trace context to
    the upstream. On exit it reads what the router recorded on the `Attempt` (TTFT, TPOT, usage,
    error): TTFT and TPOT are recorded once per attempt, never per chunk.
    """

    __slots__ = ("_attempt", "_deployment", "_span", "_telemetry", "headers", "model")

    def __init__(
        self,
        telemetry: Telemetry | None,
        parent: Context,
        model: str,
        deployment: Deployment,
        attempt: Attempt,
        number: int,
        body: Mapping[str, Any],
        traced: bool = True,
    ) -> None:
        """`traced`: the request has a trace (see `RequestTrace.traced`); without one the attempt
        makes no span and sends no trace headers, and still records its metrics."""
        self.headers: dict[str, str] = {}
        self.model = deployment.settings.model
        self._telemetry = telemetry
        self._attempt = attempt
        self._span: Span = INVALID_SPAN
        self._deployment: DeploymentTelemetry | None = None
        if telemetry is None:
            return
        self._deployment = telemetry.deployment(model, deployment.settings)
        if not traced:
            return
        self._span = telemetry.tracer.start_span(
            f"chat {self.model}", context=parent, kind=SpanKind.CLIENT, attributes=self._deployment.span_attributes
        )
        if self._span.is_recording():
            self._span.set_attribute("gateway.attempt", number)
            max_tokens = max_tokens_of(body)
            if max_tokens is not None:
                self._span.set_attribute("gen_ai.request.max_tokens", max_tokens)
        # The upstream sees this attempt as its parent (with tracing off: the client's own span).
        telemetry.propagator.inject(self.headers, context=trace.set_span_in_context(self._span))

    def __enter__(self) -> AttemptTrace:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        telemetry, deployment = self._telemetry, self._deployment
        if telemetry is None or deployment is None:
            return
        attempt = self._attempt
        if attempt.ttft_s is not None:
            deployment.ttft.record(attempt.ttft_s)
        if attempt.tpot_s is not None:
            deployment.tpot.record(attempt.tpot_s)
        if attempt.error is not None:
            failure = {**deployment.metric_attributes, "gateway.failure_reason": attempt.error}
            telemetry.instruments.failures.add(1, failure)
        if self._span.is_recording():
            self._describe(exc)
        self._span.end()

    def _describe(self, exc: BaseException | None) -> None:
        span, attempt = self._span, self._attempt
        if attempt.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", attempt.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", attempt.usage.completion_tokens)
        if attempt.finish_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", (attempt.finish_reason,))
        if attempt.error is not None:
            span.set_status(StatusCode.ERROR, attempt.error)
            span.set_attribute("gateway.failure_reason", attempt.error)
            span.set_attribute("error.type", getattr(exc, "code", attempt.error))
            if isinstance(exc, UpstreamStatusError):
                span.set_attribute("http.response.status_code", exc.upstream_status)
        elif exc is None:
            span.set_attribute("gen_ai.response.model", self.model)
        elif isinstance(exc, Exception):  # a bug in the gateway, not the upstream's failure
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            span.set_attribute("error.type", type(exc).__qualname__)
        else:  # GeneratorExit or cancellation: the client went away, no verdict on the upstream
            span.set_attribute("gateway.failure_reason", "client_closed")
