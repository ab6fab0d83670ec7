"""Quota counters in process memory: the embedded store's half of the quota contract.

The same algorithm as gateway/store/lua/admit.lua, settle.lua and renew.lua, with `clock` in
place of Redis' TIME. It is atomic because nothing here awaits: one call checks and takes
without another coroutine running in between.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.store.base import WINDOW_S, AdmitRequest, AdmitResult, QuotaScope, Reservation, ScopeUsage

_DAY_S = 86_400


@dataclass(slots=True)
class _Counters:
    requests: dict[int, int] = field(default_factory=dict)  # unix second -> requests
    tokens: dict[int, int] = field(default_factory=dict)  # unix second -> tokens
    daily: dict[int, int] = field(default_factory=dict)  # UTC day -> tokens
    leases: dict[str, float] = field(default_factory=dict)  # lease id -> expiry


@dataclass(frozen=True, slots=True)
class _Denial:
    scope: str
    limit: str
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class _Now:
    time: float
    second: int
    day: int

    @classmethod
    def at(cls, now: float) -> _Now:
        second = math.floor(now)
        return cls(now, second, second // _DAY_S)


def _live(buckets: dict[int, int], now: _Now) -> int:
    """Drop buckets that left the window; the sum of the rest."""
    for second in [s for s in buckets if s <= now.second - WINDOW_S]:
        del buckets[second]
    return sum(buckets.values())


def _window_retry(buckets: dict[int, int], used: int, need: int, cap: int, now: _Now) -> float:
    """Seconds until enough of the oldest buckets leave the window for `need` more to fit."""
    if need > cap:
        return float(WINDOW_S)  # never fits; the caller should not retry soon
    excess = used + need - cap
    for second in sorted(buckets):
        excess -= buckets[second]
        if excess <= 0:
            return max(1.0, second + WINDOW_S - now.time)
    return float(WINDOW_S)


def _window_reset(buckets: dict[int, int], now: _Now) -> float:
    """Seconds until the window holds nothing (OpenAI's x-ratelimit-reset-*)."""
    counted = [s for s, n in buckets.items() if n > 0]
    return max(0.0, max(counted) + WINDOW_S - now.time) if counted else 0.0


def _check(counters: _Counters, scope: QuotaScope, tokens: int, now: _Now) -> list[_Denial]:
    limits, denials = scope.limits, []
    if limits.rpm is not None:
        used = _live(counters.requests, now)
        if used + 1 > limits.rpm:
            retry = _window_retry(counters.requests, used, 1, limits.rpm, now)
            denials.append(_Denial(scope.name, "rpm", retry))
    if limits.tpm is not None:
        used = _live(counters.tokens, now)
        if used + tokens > limits.tpm:
            retry = _window_retry(counters.tokens, used, tokens, limits.tpm, now)
            denials.append(_Denial(scope.name, "tpm", retry))
    if limits.daily_tokens is not None:
        for day in [d for d in counters.daily if d < now.day - 1]:
            del counters.daily[day]  # yesterday's counter stays until its requests have settled
        if counters.daily.get(now.day, 0) + tokens > limits.daily_tokens:
            denials.append(_Denial(scope.name, "daily_tokens", (now.day + 1) * _DAY_S - now.time))
    if limits.max_concurrency is not None:
        _drop_expired(counters, now)
        if len(counters.leases) >= limits.max_concurrency:
            denials.append(_Denial(scope.name, "max_concurrency", 1.0))
    return denials


def _drop_expired(counters: _Counters, now: _Now) -> None:
    for lease_id in [i for i, expiry in counters.leases.items() if expiry <= now.time]:
        del counters.leases[lease_id]


def _take(counters: _Counters, scope: QuotaScope, request: AdmitRequest, now: _Now) -> None:
    limits = scope.limits
    if limits.rpm is not None:
        counters.requests[now.second] = counters.requests.get(now.second, 0) + 1
    if limits.tpm is not None:
        counters.tokens[now.second] = counters.tokens.get(now.second, 0) + request.tokens
    if limits.daily_tokens is not None:
        counters.daily[now.day] = counters.daily.get(now.day, 0) + request.tokens
    if limits.max_concurrency is not None:
        counters.leases[request.lease_id] = now.time + request.lease_ttl_s


def _usage(counters: _Counters, scope: QuotaScope, now: _Now) -> ScopeUsage:
    # _check pruned the counters, so these sums cover the window only.
    rpm, tpm = scope.limits.rpm, scope.limits.tpm
    return ScopeUsage(
        requests_remaining=None if rpm is None else max(0, rpm - sum(counters.requests.values())),
        requests_reset_s=0.0 if rpm is None else _window_reset(counters.requests, now),
        tokens_remaining=None if tpm is None else max(0, tpm - sum(counters.tokens.values())),
        tokens_reset_s=0.0 if tpm is None else _window_reset(counters.tokens, now),
    )


def _adjust(counts: dict[int, int], key: int, delta: int) -> None:
    if key in counts:
        counts[key] = max(0, counts[key] + delta)


class MemoryQuotas:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counters: dict[tuple[str, str], _Counters] = {}

    def _of(self, tenant: str, scope: str) -> _Counters:
        return self._counters.setdefault((tenant, scope), _Counters())

    def admit(self, request: AdmitRequest) -> AdmitResult:
        now = _Now.at(self._clock())
        counters = [self._of(request.tenant, scope.name) for scope in request.scopes]
        denials: list[_Denial] = []
        for scope, scope_counters in zip(request.scopes, counters, strict=True):
            denials += _check(scope_counters, scope, request.tokens, now)
        if not denials:
            for scope, scope_counters in zip(request.scopes, counters, strict=True):
                _take(scope_counters, scope, request, now)
        usage = {
            scope.name: _usage(scope_counters, scope, now)
            for scope, scope_counters in zip(request.scopes, counters, strict=True)
        }
        if denials:
            # The longest wait, so that a client retrying after it is not denied again at once.
            worst = max(denials, key=lambda d: d.retry_after_s)
            return AdmitResult(False, None, worst.scope, worst.limit, worst.retry_after_s, usage)
        reservation = Reservation(request.lease_id, request.tokens, now.second, now.day)
        return AdmitResult(True, reservation, usage=usage)

    def settle(self, tenant: str, scopes: tuple[QuotaScope, ...], reservation: Reservation, used_tokens: int) -> None:
        now = _Now.at(self._clock())
        delta = used_tokens - reservation.tokens
        for scope in scopes:
            counters = self._counters.get((tenant, scope.name))
            if counters is None:
                continue
            if reservation.second > now.second - WINDOW_S:
                _adjust(counters.tokens, reservation.second, delta)
            _adjust(counters.daily, reservation.day, delta)
            counters.leases.pop(reservation.lease_id, None)

    def renew_lease(self, tenant: str, scopes: tuple[QuotaScope, ...], lease_id: str, ttl_s: float) -> None:
        now = _Now.at(self._clock())
        for scope in scopes:
            counters = self._counters.get((tenant, scope.name))
            if counters is None:
                continue
            _drop_expired(counters, now)  # an expired lease is not revived: its slot may be taken
            if lease_id in counters.leases:
                counters.leases[lease_id] = now.time + ttl_s
