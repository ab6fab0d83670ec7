"""The pipeline stage that gives each request its server span, its request metric and its log line.

It is the outermost stage, so refusals (401, 404, 429) are traced and counted too. The span
starts at the first pull and ends when the stream is closed, whichever task pulls it (the HTTP
handler, then a session producer): see `request_trace.py` for why it is made current only while
each chunk is pulled.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence

from opentelemetry import context
from opentelemetry.trace import StatusCode

from gateway.audit.stage import CLIENT_CLOSED, failure_reason
from gateway.core.chunks import Chunk
from gateway.errors import GatewayError
from gateway.pipeline import Handler, RequestContext
from gateway.telemetry.providers import Attributes, Telemetry
from gateway.telemetry.request_trace import RequestTrace, max_tokens_of

log = logging.getLogger("gateway.requests")


class TraceRequests:
    def __init__(self, telemetry: Telemetry, models: Sequence[str], span_name: str | None = None):
        """`span_name`: the request span's, else `POST` and the request's surface's route."""
        self._telemetry = telemetry
        self._models = frozenset(models)
        self._span_name = span_name

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        span_name = self._span_name or f"POST {ctx.surface.path}"
        trace = ctx.trace = RequestTrace.start(self._telemetry, span_name, ctx.headers)
        status, error = CLIENT_CLOSED, None
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                # With no trace at all (no exporter, no traceparent) there is nothing to make
                # current: two context switches a chunk fewer.
                traced = trace.traced
                while True:
                    if not traced:
                        chunk = await anext(chunks, None)
                    else:
                        # Current only for this pull: attached and detached in the same task, the
                        # only way that is safe when the next pull may come from another task.
                        token = context.attach(trace.context)
                        try:
                            chunk = await anext(chunks, None)
                        finally:
                            context.detach(token)
                    if chunk is None:
                        break
                    if chunk.finish_reason is not None:
                        trace.finish_reason = chunk.finish_reason
                    yield chunk
            status = 200
        except GatewayError as failure:
            # After output the client got a 200 with an in-band error event (Meter times the first output).
            status, error = (200 if ctx.ttft_s is not None else failure.status), failure
            raise
        except Exception:
            status = 500
            raise
        finally:
            self._finish(ctx, trace, status, error)

    def _finish(self, ctx: RequestContext, trace: RequestTrace, status: int, error: GatewayError | None) -> None:
        model = ctx.model if ctx.model in self._models else ""  # a label per made-up model name would never end
        self._telemetry.requests.add(ctx.surface.name, model, ctx.route.deployment or "", status)
        span = trace.span
        if span.is_recording():
            span.set_attributes(self._span_attributes(ctx, trace, status, error))
            if error is not None or status >= 500:
                span.set_status(StatusCode.ERROR, error.code if error is not None else "internal_error")
        # A line per request costs about as much as all the metrics together: answered requests are
        # logged at DEBUG (`--log-level debug`), refusals (4xx) at INFO, failures at WARNING: 5xx,
        # and streams that ended with an in-band error after a 200.
        if error is None and status < 500:
            level = logging.DEBUG
        elif status >= 500 or status == 200:
            level = logging.WARNING
        else:
            level = logging.INFO
        if log.isEnabledFor(level):
            token = context.attach(trace.context)  # the line carries the request's trace and span ids
            try:
                _log_request(ctx, status, error, level)
            finally:
                context.detach(token)
        span.end()

    def _span_attributes(
        self, ctx: RequestContext, trace: RequestTrace, status: int, error: GatewayError | None
    ) -> Attributes:
        attributes: Attributes = {
            "http.response.status_code": status,
            "gateway.request_id": ctx.request_id,
            "gateway.surface": ctx.surface.name,
            "gateway.attempts": len(ctx.route.attempts),
            "gateway.failovers": ctx.route.failovers,
        }
        optional: dict[str, str | int | None] = {
            "gen_ai.request.model": ctx.model or None,
            "gen_ai.request.max_tokens": max_tokens_of(ctx.body),
            "gateway.deployment": ctx.route.deployment,
            "gateway.session_id": ctx.session_id,
            "gateway.tenant": ctx.principal.tenant if ctx.principal else None,
            "gateway.key_id": ctx.principal.key_id if ctx.principal else None,
            "gateway.failure_reason": failure_reason(ctx, error),
            "error.type": error.code if error is not None else None,
            "gateway.quota_note": ctx.quota_note,
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        if ctx.ttft_s is not None:  # output reached the client
            attributes["gen_ai.response.id"] = ctx.completion_id
            attributes["gen_ai.response.model"] = ctx.model
            attributes["gen_ai.usage.input_tokens"] = ctx.usage.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = ctx.usage.completion_tokens
        if trace.finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = (trace.finish_reason,)
        if ctx.route.deployment is not None and ctx.model in self._models:
            served_by = self._telemetry.served_by(ctx.model, ctx.route.deployment)
            if served_by is not None:
                attributes["gen_ai.provider.name"] = attributes["gen_ai.system"] = served_by
        return attributes


def _log_request(ctx: RequestContext, status: int, error: GatewayError | None, level: int) -> None:
    # Sizes, names and outcomes only: never the prompt, the completion or the key.
    fields = {
        "request_id": ctx.request_id,
        "session_id": ctx.session_id,
        "tenant": ctx.principal.tenant if ctx.principal else None,
        "key_id": ctx.principal.key_id if ctx.principal else None,
        "model": ctx.model or None,
        "deployment": ctx.route.deployment,
        "status": status,
        "error": error.code if error is not None else None,
        # What the client was not told: an upstream's own error text stays in the log.
        "error_detail": error.message if error is not None and error.message != error.public_message else None,
        "failure_reason": failure_reason(ctx, error),
        "attempts": len(ctx.route.attempts),
        "failovers": ctx.route.failovers,
        "prompt_tokens": ctx.usage.prompt_tokens,
        "completion_tokens": ctx.usage.completion_tokens,
        "ttft_ms": round(ctx.ttft_s * 1000, 3) if ctx.ttft_s is not None else None,
        "duration_ms": round((time.monotonic() - ctx.started) * 1000, 3),
    }
    log.log(level, "chat completion", extra=fields)
