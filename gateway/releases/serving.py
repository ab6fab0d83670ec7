"""The replica side of releases: which release serves a new request, and staying current.

`ReleaseWatcher` polls the store's generations so that a switch made on any replica (or by the
CLI) reaches this one within `releases.watch_interval_s`. `ApplyRelease` puts the active release -
or, for its share of traffic, the canary - on each new request and reports outcomes to the canary
monitor; an admin key may pin any release with the `X-Gateway-Release` header (the preflight's
evals do, see candidate_path.py). Every answer names its release in the same header.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

from checkpoints.registry import verify
from gateway.auth.principal import Scope
from gateway.backends.base import Chunk
from gateway.errors import GatewayError, PermissionDenied, StoreCorrupt
from gateway.pipeline import Handler, RequestContext
from gateway.releases.canary import Outcome
from gateway.releases.candidate_path import RELEASE_HEADER
from gateway.releases.service import ActiveReleases, ReleaseService
from gateway.store.base import ReleaseStore
from gateway.store.release_record import CheckpointPin, Release

RELEASE_RESPONSE_HEADER = "X-Gateway-Release"  # on every answer: which release produced it

log = logging.getLogger(__name__)


class ReleaseWatcher:
    """Polls the store's generations so that a switch made on any replica reaches this one.

    Every replica reads the same records, so whatever one bad record does, it does fleet-wide: a
    model whose record does not decode keeps its last known release (logged once per distinct
    problem, counted by `on_corrupt`) while the other models still follow the store, and the loop
    outlives any error of a poll."""

    def __init__(self, store: ReleaseStore, service: ReleaseService, interval_s: float) -> None:
        self._store = store
        self._service = service
        self._interval_s = interval_s
        self._corrupt: dict[str, str] = {}  # model -> the problem last logged for it
        # Set by app.py: counts each newly found malformed record (by model) in the metrics.
        self.on_corrupt: Callable[[str], None] | None = None

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except GatewayError:  # store down: keep serving the last known release
                pass
            except Exception:  # a bug: a dead watcher would hide every later switch, silently
                log.exception("the release watcher's poll failed; next poll in %.1f s", self._interval_s)
            await asyncio.sleep(self._interval_s)

    async def poll(self) -> None:
        generations = await self._store.release_generations()
        for model, generation in generations.items():
            if self._service.active.generations.get(model) != generation:
                await self._refresh(model)
        await self._service.advance_canaries()

    async def _refresh(self, model: str) -> None:
        # refresh() sets the generation last: after a StoreCorrupt the next poll tries again, so
        # the model recovers as soon as the record is repaired.
        try:
            await self._service.refresh(model)
        except StoreCorrupt as corrupt:
            if self._corrupt.get(model) != corrupt.message:
                self._corrupt[model] = corrupt.message
                kept = self._service.active.records.get(model)
                log.error("model %s keeps release %s: %s", model, kept.version if kept else None, corrupt.message)
                if self.on_corrupt is not None:
                    self.on_corrupt(model)
            return
        if self._corrupt.pop(model, None) is not None:
            log.warning("model %s follows the store again: its release records decode", model)


class CheckpointWatch:
    """Verifies each active release's checkpoint again every `interval_s` (hashing runs in a
    thread), so that weights changed or lost under a running release make /readyz say so."""

    def __init__(self, active: ActiveReleases, interval_s: float) -> None:
        self._active = active
        self._interval_s = interval_s

    async def run(self) -> None:
        while True:
            for model, record in list(self._active.records.items()):
                pin = record.checkpoint
                problems = await asyncio.to_thread(_checkpoint_problems, pin) if pin else []
                if self._active.records.get(model) is record:  # not switched meanwhile
                    self._active.checkpoint_problems[model] = problems
            for model in set(self._active.checkpoint_problems) - set(self._active.records):
                del self._active.checkpoint_problems[model]
            await asyncio.sleep(self._interval_s)


def _checkpoint_problems(pin: CheckpointPin) -> list[str]:
    report = verify(Path(pin.path), expected_digest=pin.manifest_digest)
    return [f"checkpoint {pin.version} {problem}" for problem in report.problems]


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
                self._service.observe(ctx.model, Outcome(time.monotonic(), on_canary, ok, ctx.ttft_s, tpot))

    async def _pinned(self, ctx: RequestContext, version: str) -> Release:
        """An admin may address any release (the preflight does): how a candidate is tried as users
        would get it before it is active. Chat keys may not choose."""
        assert ctx.principal is not None
        if Scope.ADMIN.value not in ctx.principal.scopes:
            raise PermissionDenied(f"only an admin key may address a release with {RELEASE_HEADER}")
        return await self._service.release(ctx.model, version)


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
        messages = ctx.body["messages"]
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
    messages = ctx.body["messages"]
    # A stateful session's stored history already starts with it: add it once.
    if system_prompt and (not messages or messages[0] != prompt_message):
        ctx.body = {**ctx.body, "messages": [prompt_message, *messages]}
