"""Quotas: reserve before the call, settle with real usage after it.

Every request takes, in one atomic store call for the key and its tenant at once, one request
of the RPM window, an estimate of its tokens (prompt estimate + max_tokens) from the TPM window
and the daily budget, and a concurrency lease. When the stream ends - finished, failed or
abandoned by the client - the reservation is replaced by the real usage and the lease freed.
Settling runs as its own task, so a cancelled request still settles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass

from gateway.core.chunks import Chunk
from gateway.core.principal import Limits, Principal
from gateway.errors import InsufficientQuota, RateLimited, StoreNotReached, StoreUnavailable
from gateway.ids import RandomIds
from gateway.pipeline import Handler, RequestContext
from gateway.settings import FailMode, Operation, QuotaSettings
from gateway.store.base import AdmitRequest, AdmitResult, QuotaScope, QuotaStore, Reservation, ScopeUsage
from gateway.store.session_record import QuotaHold
from gateway.tokens import counted, estimate_prompt_tokens

log = logging.getLogger("gateway.quota")  # its name as gateway/quota.py: operators filter by it

_RETRY_S = (0.05, 1.0)  # settling against a store that is down: first retry, longest wait


def rate_limit_headers(usage: dict[str, ScopeUsage], scopes: tuple[QuotaScope, ...]) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers, from the most constrained scope of each kind."""
    return {**_headers_for("requests", "rpm", usage, scopes), **_headers_for("tokens", "tpm", usage, scopes)}


def _headers_for(
    kind: str, limit_name: str, usage: dict[str, ScopeUsage], scopes: tuple[QuotaScope, ...]
) -> dict[str, str]:
    tightest: tuple[int, int, float] | None = None
    for scope in scopes:
        limit: int | None = getattr(scope.limits, limit_name)
        scope_usage = usage.get(scope.name)
        remaining: int | None = getattr(scope_usage, f"{kind}_remaining", None)
        if limit is None or scope_usage is None or remaining is None:
            continue
        if tightest is None or remaining < tightest[1]:
            tightest = (limit, remaining, getattr(scope_usage, f"{kind}_reset_s"))
    if tightest is None:
        return {}
    limit, remaining, reset_s = tightest
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(remaining),
        f"x-ratelimit-reset-{kind}": f"{reset_s:g}s",
    }


@dataclass(slots=True)
class _Held:
    tenant: str
    scopes: tuple[QuotaScope, ...]
    reservation: Reservation


class Admit:
    """The quota stage of the pipeline."""

    def __init__(self, store: QuotaStore, settings: QuotaSettings) -> None:
        self._store = store
        self._settings = settings
        self._tenant_limits = {name: Limits(**lim.model_dump()) for name, lim in settings.tenants.items()}
        self._settling: set[asyncio.Task[None]] = set()
        self._ids = RandomIds()
        self.fail_open_count = 0
        self.settle_retry_count = 0  # settlements that had to wait for the store
        self.unsettled_count = 0  # settlements given up (lease left to expire)

    def scopes_for(self, ctx: RequestContext) -> tuple[QuotaScope, ...]:
        assert ctx.principal is not None
        return self._scopes_of(ctx.principal)

    def _scopes_of(self, principal: Principal) -> tuple[QuotaScope, ...]:
        scopes = [QuotaScope(f"key:{principal.key_id}", principal.limits)]
        tenant_limits = self._tenant_limits.get(principal.tenant)
        if tenant_limits is not None:
            scopes.append(QuotaScope("tenant", tenant_limits))
        return tuple(s for s in scopes if s.limits != Limits())

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        held: _Held | None
        if ctx.quota_hold is not None:
            # A session taken over from a dead replica: its request was admitted there. Keep that
            # reservation's slot and settle it with the whole answer's usage; take no second one.
            held = _adopted(ctx.quota_hold)
            await self._renew(held)
        else:
            scopes = self.scopes_for(ctx)
            held = await self._reserve(ctx, scopes) if scopes else None
            ctx.quota_hold = _hold_of(held) if held is not None else None
        # The lease is kept alive by time, not by chunks: a response held for a human approval
        # sends nothing for minutes and must keep its concurrency slot all the same.
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(held)) if held else None
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            if held is not None:
                # Never less than what was relayed, whatever the upstream reported (tokens.py).
                used = counted(ctx.usage, ctx.estimated_prompt_tokens, ctx.relayed_tokens).total_tokens
                ctx.charged_tokens = used
                self._spawn_settle(held.tenant, held.scopes, held.reservation, used)

    @contextlib.asynccontextmanager
    async def metered(self, principal: Principal) -> AsyncIterator[None]:
        """Meter one call that is not a chat completion (an MCP tool call): a request against the
        RPM limits and a concurrency lease while it runs (renewed, as a call held for approval may
        take minutes), no tokens. Refused with RateLimited; fail_open / fail_closed as for chat."""
        scopes = self._scopes_of(principal)
        if not scopes:
            yield
            return
        lease_ttl_s = self._settings.lease_ttl_s
        request = AdmitRequest(principal.tenant, scopes, self._ids.hex(), tokens=0, lease_ttl_s=lease_ttl_s)
        try:
            result = await self._store.admit(request)
        except StoreUnavailable:
            if self._settings.on_store_error is FailMode.CLOSED:
                raise
            self.fail_open_count += 1
            yield
            return
        if not result.admitted:
            raise _denied(result, {})
        assert result.reservation is not None
        held = _Held(principal.tenant, scopes, result.reservation)
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(held))
        try:
            yield
        finally:
            heartbeat.cancel()
            self._spawn_settle(held.tenant, held.scopes, held.reservation, 0)

    async def _reserve(self, ctx: RequestContext, scopes: tuple[QuotaScope, ...]) -> _Held | None:
        assert ctx.principal is not None
        ctx.estimated_prompt_tokens = estimate_prompt_tokens(ctx.body)
        max_tokens = ctx.body.get("max_completion_tokens") or ctx.body.get("max_tokens")
        if ctx.operation is not Operation.CHAT:
            max_tokens = 0  # embeddings write nothing: their cost is their input
        elif max_tokens is None and any(s.limits.tpm is not None or s.limits.daily_tokens is not None for s in scopes):
            # What is reserved is what may be written: the upstream is told, and the router ends
            # an answer that goes past it (with finish_reason "length") if the upstream does not.
            max_tokens = self._settings.default_max_tokens
            ctx.body = {**ctx.body, "max_tokens": max_tokens}
        tokens = ctx.estimated_prompt_tokens + int(
            self._settings.default_max_tokens if max_tokens is None else max_tokens
        )
        request = AdmitRequest(
            tenant=ctx.principal.tenant,
            scopes=scopes,
            lease_id=self._ids.hex(),
            tokens=tokens,
            lease_ttl_s=self._settings.lease_ttl_s,
        )
        try:
            result = await self._store.admit(request)
        except StoreUnavailable as error:
            if not isinstance(error, StoreNotReached):
                # The script may have run with its answer lost: free the lease it may hold as soon
                # as the store is back, or a short outage holds slots for the whole lease TTL.
                self._spawn_settle(request.tenant, scopes, Reservation(request.lease_id, 0, 0, 0), 0)
            if self._settings.on_store_error is FailMode.CLOSED:
                raise
            self.fail_open_count += 1
            # The store's own words say which outage it was (refused, timed out, pool exhausted).
            ctx.quota_note = f"fail_open: store unavailable, request not metered ({str(error)[:160]})"
            return None
        ctx.response_headers.update(rate_limit_headers(result.usage, scopes))
        if not result.admitted:
            ctx.trace.quota_rejected(result.denied_limit or "unknown", result.denied_scope or "", result.retry_after_s)
            raise _denied(result, ctx.response_headers)
        assert result.reservation is not None
        return _Held(ctx.principal.tenant, scopes, result.reservation)

    async def _heartbeat(self, held: _Held) -> None:
        while True:
            await asyncio.sleep(self._settings.lease_ttl_s / 3)
            await self._renew(held)

    async def _renew(self, held: _Held) -> None:
        ttl = self._settings.lease_ttl_s
        await self._quietly(self._store.renew_lease(held.tenant, held.scopes, held.reservation.lease_id, ttl))

    def _spawn_settle(self, tenant: str, scopes: tuple[QuotaScope, ...], reservation: Reservation, used: int) -> None:
        task = asyncio.get_running_loop().create_task(self._settle(tenant, scopes, reservation, used))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, tenant: str, scopes: tuple[QuotaScope, ...], reservation: Reservation, used: int) -> None:
        """Settle, retrying with backoff while the store is down: a lease not freed holds a
        concurrency slot for up to `lease_ttl_s` (issue 12: a 2 s outage held them for 60 s).
        Past that TTL the lease has expired by itself and only the token count stays estimated."""
        deadline = time.monotonic() + self._settings.lease_ttl_s
        delay = _RETRY_S[0]
        while True:
            try:
                await self._store.settle(tenant, scopes, reservation, used)
                return
            except StoreUnavailable as error:
                if time.monotonic() + delay > deadline:
                    self.unsettled_count += 1
                    log.warning("gave up settling a quota reservation (its lease expires by itself): %s", error)
                    return
                if delay == _RETRY_S[0]:
                    self.settle_retry_count += 1
                    log.info("settling a quota reservation when the store is back: %s", error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_S[1])

    async def _quietly(self, work: Awaitable[object]) -> None:
        try:
            await work
        except StoreUnavailable as error:
            # The lease expires by itself; renewing is only needed for long requests.
            log.warning("could not renew a quota lease: %s", error)

    async def drain(self, within_s: float = 5.0) -> None:
        """Wait for pending settlements (graceful shutdown), at most `within_s`: settlements still
        waiting for a store that is down are given up (their leases expire by themselves)."""
        if not self._settling:
            return
        _, pending = await asyncio.wait(set(self._settling), timeout=within_s)
        if pending:
            log.warning("%d quota settlements abandoned at shutdown (store unavailable)", len(pending))
            self.unsettled_count += len(pending)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


def _hold_of(held: _Held) -> QuotaHold:
    reservation = held.reservation
    return QuotaHold(
        tenant=held.tenant,
        scopes=tuple(scope.name for scope in held.scopes),
        lease_id=reservation.lease_id,
        tokens=reservation.tokens,
        second=reservation.second,
        day=reservation.day,
    )


def _adopted(hold: QuotaHold) -> _Held:
    # Settling and renewing need only the scopes' names: their limits were checked at admission.
    scopes = tuple(QuotaScope(name, Limits()) for name in hold.scopes)
    return _Held(hold.tenant, scopes, Reservation(hold.lease_id, hold.tokens, hold.second, hold.day))


def _denied(result: AdmitResult, headers: dict[str, str]) -> RateLimited:
    limit, scope = result.denied_limit, result.denied_scope
    who = "tenant" if scope == "tenant" else "API key"
    if limit == "daily_tokens":
        error: RateLimited = InsufficientQuota(
            f"The {who}'s daily token budget is spent", retry_after_s=result.retry_after_s
        )
    else:
        names = {
            "rpm": "requests per minute",
            "tpm": "tokens per minute",
            "max_concurrency": "concurrent requests",
        }
        error = RateLimited(
            f"Rate limit reached for {who}: {names.get(limit or '', limit)}",
            retry_after_s=result.retry_after_s,
        )
    error.extra_headers = dict(headers)
    return error
