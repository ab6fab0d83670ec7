"""What the audit log says about a request, and the pipeline stage that says it.

The stage is the outermost one, so a request refused by auth or quota is recorded too. Prompts
and completions are stored only as SHA-256 digests unless capture mode is on; then they are kept
with secrets redacted, for replay. Requests without a valid key are only counted (see
`RefusalTally`): recording each would let anyone grow the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson

from gateway.audit.writer import AuditWriter
from gateway.core.chunks import Chunk
from gateway.errors import AuthenticationFailed, GatewayError
from gateway.pipeline import Handler, RequestContext

log = logging.getLogger("gateway.audit_records")  # its name as gateway/audit_records.py: operators filter by it

CLIENT_CLOSED = 499  # nginx's convention for "the client went away first"

_SECRETS = re.compile(
    r"(?:agw_[A-Za-z0-9_-]{20,}|sk-[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|ghp_[A-Za-z0-9]{30,}"
    r"|xox[bpas]-[A-Za-z0-9-]{10,}|(?i:bearer)\s+[A-Za-z0-9._~+/-]{16,}=*"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----)"
)


def redact(text: str) -> str:
    return _SECRETS.sub("[REDACTED]", text)


def _redact_tree(node: Any) -> Any:
    if isinstance(node, str):
        return redact(node)
    if isinstance(node, list):
        return [_redact_tree(v) for v in node]
    if isinstance(node, dict):
        return {k: _redact_tree(v) for k, v in node.items()}
    return node


def sha256_json(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def request_record(ctx: RequestContext, status: int, error: GatewayError | None, capture: bool) -> dict[str, Any]:
    principal = ctx.principal
    completion = "".join(ctx.completion_text)
    record: dict[str, Any] = {
        "kind": "request",
        "request_id": ctx.request_id,
        "surface": ctx.surface.name,
        "tenant": principal.tenant if principal else None,
        "key_id": principal.key_id if principal else None,
        "model": ctx.model,
        "release": ctx.release,
        "session_id": ctx.session_id,
        "deployments": [a.deployment for a in ctx.route.attempts],
        "attempts": [{"deployment": a.deployment, "error": a.error} for a in ctx.route.attempts],
        "status": status,
        "error": error.code if error else None,
        "failure_reason": failure_reason(ctx, error),
        "prompt_tokens": ctx.usage.prompt_tokens,
        "completion_tokens": ctx.usage.completion_tokens,
        # The partial answer a continuation resent (its cost, not billed as prompt), the gateway's
        # own count of what it relayed, and what the quota was settled with (None: not metered).
        "continuation_prompt_tokens": ctx.usage.continuation_prompt_tokens,
        "relayed_tokens": ctx.relayed_tokens,
        "charged_tokens": ctx.charged_tokens,
        "ttft_ms": round(ctx.ttft_s * 1000, 3) if ctx.ttft_s is not None else None,
        "duration_ms": round((time.monotonic() - ctx.started) * 1000, 3),
        "prompt_sha256": sha256_json(ctx.body.get("messages", ctx.body.get("input"))),  # input: embeddings
        "completion_sha256": hashlib.sha256(completion.encode()).hexdigest(),
        "quota_note": ctx.quota_note,
        "session_note": "answered without a checkpoint: the store was unavailable" if ctx.session_unresumable else None,
    }
    if capture:
        record["capture"] = {"request": _redact_tree(ctx.body), "completion": redact(completion)}
    return record


def failure_reason(ctx: RequestContext, error: GatewayError | None) -> str | None:
    """The last upstream failure's reason, or the error's own code when no attempt failed."""
    if error is None:
        return None
    failed = [a.error for a in ctx.route.attempts if a.error]
    return failed[-1] if failed else error.code


class AuditRequests:
    """The pipeline stage: one audit record per request, whatever its outcome.

    The exception is a request refused for want of a valid key: anyone can send those, so they
    are counted in a `RefusalTally` (one record per interval) instead of recorded one by one.
    """

    def __init__(self, writer: AuditWriter, *, capture: bool, refusals: RefusalTally) -> None:
        self._writer = writer
        self._capture = capture
        self._refusals = refusals

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        # Backpressure happens here, before any work is done; no slot is held while the request
        # runs (a held tool call or a slow body would keep it from every other tenant).
        await self._writer.admit()
        status, error, sent_output = CLIENT_CLOSED, None, False
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    if chunk.content:
                        ctx.completion_text.append(chunk.content)
                    sent_output = sent_output or chunk.carries_output
                    yield chunk
            status = 200
        except GatewayError as failure:
            # After output the client got a 200 with an in-band error event.
            status, error = (200 if sent_output else failure.status), failure
            raise
        except Exception:
            status = 500
            raise
        finally:
            self._settle(ctx, status, error)

    def _settle(self, ctx: RequestContext, status: int, error: GatewayError | None) -> None:
        """Queue the record; never raises (it runs while an exception may be propagating)."""
        if isinstance(error, AuthenticationFailed) and ctx.principal is None:
            self._refusals.count(ctx.client, error.code)
            return
        try:
            record = request_record(ctx, status, error, self._capture)
        except Exception as failure:  # a bug in building the record must not cost the record
            log.exception("audit record of request %s could not be built", ctx.request_id)
            record = minimal_record(ctx, status, error, failure)
        self._writer.record(record)


def minimal_record(ctx: RequestContext, status: int, error: GatewayError | None, failure: Exception) -> dict[str, Any]:
    principal = ctx.principal
    return {
        "kind": "request",
        "request_id": ctx.request_id,
        "surface": ctx.surface.name,
        "tenant": principal.tenant if principal else None,
        "key_id": principal.key_id if principal else None,
        "model": ctx.model,
        "session_id": ctx.session_id,
        "status": status,
        "error": error.code if error else None,
        "record_error": type(failure).__name__,
    }


OTHER_SOURCES = "other"


class RefusalTally:
    """Requests refused for want of a valid key, counted per (source, reason) and written as one
    `auth_refusals` record per interval: however many such requests arrive, the audit log grows
    by at most one record per interval, and memory by at most `max_sources` counters."""

    def __init__(
        self, writer: AuditWriter, *, interval_s: float, max_sources: int, clock: Callable[[], float] = time.time
    ) -> None:
        self._writer = writer
        self._interval_s = interval_s
        self._max_sources = max_sources
        self._clock = clock
        self._counts: dict[tuple[str, str], int] = {}
        self._since = clock()
        self._task: asyncio.Task[None] | None = None

    def count(self, source: str, reason: str) -> None:
        key = (source, reason)
        if key not in self._counts and len(self._counts) >= self._max_sources:
            key = (OTHER_SOURCES, reason)
        self._counts[key] = self._counts.get(key, 0) + 1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="audit-refusals")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush()

    async def flush(self) -> None:
        counts, self._counts = self._counts, {}
        since, self._since = self._since, self._clock()
        if not counts:
            return
        await self._writer.submit(
            {
                "kind": "auth_refusals",
                "tenant": None,
                "since": since,
                "until": self._since,
                "counts": [
                    {"source": source, "reason": reason, "count": n} for (source, reason), n in sorted(counts.items())
                ],
            }
        )
