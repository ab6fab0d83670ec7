"""The release stages of the request path: which release serves a new request.

`ApplyRelease` puts the active release - or, for its share of traffic, the canary - on each new
request and reports outcomes to the canary monitor; an admin key may pin any release with the
`X-Gateway-Release` header (the preflight's evals do, see candidate.py). Every answer names
its release in the same header. `CanaryFallback` serves a canary request the candidate fails with
the active release.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncGenerator

from gateway.core.chunks import Chunk
from gateway.core.principal import Scope
from gateway.errors import GatewayError, PermissionDenied
from gateway.pipeline import Handler, RequestContext
from gateway.releases.active import ActiveReleases
from gateway.releases.canary import Outcome
from gateway.releases.candidate import RELEASE_HEADER
from gateway.releases.service import ReleaseService
from gateway.store.release_record import Release

RELEASE_RESPONSE_HEADER = "X-Gateway-Release"  # on every answer: which release produced it


class ApplyRelease:
    """The pipeline stage: the active release's deployments and prompt apply to new requests, or the
    canary's for its share of them; a request in flight keeps the release it started with."""

    def __init__(self, active: ActiveReleases, service: ReleaseService, rng: random.Random | None = None) -> None:
        self._active = active
        self._service = service
        self._rng = rng or random.Random()

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        pinned = ctx.headers.get(RELEASE_HEADER)
        if pinned:
            _apply(ctx, await self._pinned(ctx, pinned))
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        record = self._active.records.get(ctx.model)
        canary = self._active.canaries.get(ctx.model)
        on_canary = canary is not None and self._rng.random() < canary.settings.share
        if on_canary:
            ctx.release_fallback = record
            record = self._active.canary_records[ctx.model]
        if record is not None:
            _apply(ctx, record)
        ok = False
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    yield chunk
            ok = True
        finally:
            if record is not None and canary is not None:
                tpot = ctx.route.attempts[-1].tpot_s if ctx.route.attempts else None
                if ctx.canary_failed:  # the candidate failed; the active release answered instead
                    ok, tpot = False, None
                self._service.canaries.observe(ctx.model, Outcome(time.monotonic(), on_canary, ok, ctx.ttft_s, tpot))

    async def _pinned(self, ctx: RequestContext, version: str) -> Release:
        """An admin may address any release (the preflight does): how a candidate is tried as users
        would get it before it is active. Chat keys may not choose."""
        assert ctx.principal is not None
        if Scope.ADMIN.value not in ctx.principal.scopes:
            raise PermissionDenied(f"only an admin key may address a release with {RELEASE_HEADER}")
        return await self._service.switchboard.release(ctx.model, version)


class CanaryFallback:
    """Innermost: a canary request the candidate fails before any output is served by the active
    release instead (its deployments and prompt), so a broken candidate costs its canary a failed
    request, not a client an error. Inside quota admission: the client's one request is admitted
    once."""

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        fallback = ctx.release_fallback
        sent = False
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    sent = True
                    yield chunk
            return
        except GatewayError:
            if sent or fallback is None:
                raise
        ctx.canary_failed = True
        candidate_prompt = {"role": "system", "content": ctx.release_prompt}
        messages = ctx.body.get("messages")
        if ctx.release_prompt and messages and messages[0] == candidate_prompt:
            ctx.body = {**ctx.body, "messages": messages[1:]}
        _apply(ctx, fallback)
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk


def _apply(ctx: RequestContext, record: Release) -> None:
    ctx.release = record.version
    ctx.response_headers[RELEASE_RESPONSE_HEADER] = record.version
    ctx.deployments = frozenset(record.deployments)
    system_prompt = record.prompt.system_prompt
    ctx.release_prompt = system_prompt
    prompt_message = {"role": "system", "content": system_prompt}
    messages = ctx.body.get("messages")
    if messages is None:
        return  # not a conversation (embeddings): there is no prompt to put in front
    # A stateful session's stored history already starts with it: add it once.
    if system_prompt and (not messages or messages[0] != prompt_message):
        ctx.body = {**ctx.body, "messages": [prompt_message, *messages]}
