"""What the audit log says about a request, and the pipeline stage that says it.

The stage is the outermost one, so a request refused by auth or quota is recorded too. Prompts
and completions are stored only as SHA-256 digests unless capture mode is on; then they are kept
with secrets redacted, for replay.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from gateway.audit import AuditWriter
from gateway.backends.base import Chunk
from gateway.errors import GatewayError
from gateway.pipeline import Handler, RequestContext

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
        "ttft_ms": round(ctx.ttft_s * 1000, 3) if ctx.ttft_s is not None else None,
        "duration_ms": round((time.monotonic() - ctx.started) * 1000, 3),
        "prompt_sha256": sha256_json(ctx.body.get("messages")),
        "completion_sha256": hashlib.sha256(completion.encode()).hexdigest(),
        "quota_note": ctx.quota_note,
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
    """The pipeline stage: one audit record per request, whatever its outcome."""

    def __init__(self, writer: AuditWriter, *, capture: bool) -> None:
        self._writer = writer
        self._capture = capture

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        await self._writer.reserve()  # backpressure happens here, before any work is done
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
        finally:
            self._writer.submit_reserved(request_record(ctx, status, error, self._capture))
