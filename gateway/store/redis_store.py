"""The store for several replicas: everything in Redis, every multi-key operation one Lua script.

Key names and TTLs are in gateway/store/keys.py, the scripts in gateway/store/lua/, sessions in
gateway/store/redis_sessions.py, approvals in gateway/store/redis_approvals.py, model releases in
gateway/store/redis_releases.py. Every failure to
talk to Redis becomes StoreUnavailable (redis_common.unavailable); nothing redis-specific gets out.

Failing fast matters more than riding out a blip: the caller decides (fail open or closed),
so redis-py's own retries are off and every wait is bounded by the configured timeouts. A
pooled connection that Redis closed is detected and replaced when it is taken from the pool.
"""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.maint_notifications import MaintNotificationsConfig

from gateway.settings import RedisStoreSettings
from gateway.store import keys
from gateway.store.approval_record import Approval, Decision, PendingCaps
from gateway.store.audit_batch import AuditRecord, canonical, check_batch
from gateway.store.base import (
    WINDOW_S,
    AdmitRequest,
    AdmitResult,
    AuditHead,
    KeyRecord,
    QuotaScope,
    Reservation,
    ScopeUsage,
    SessionCheckpoint,
)
from gateway.store.call_outcomes import CallOutcomes
from gateway.store.fields import stored
from gateway.store.redis_approvals import RedisApprovals
from gateway.store.redis_common import Client, ClusterClient, script, unavailable
from gateway.store.redis_releases import RedisReleases
from gateway.store.redis_sessions import RedisSessions
from gateway.store.release_record import Canary, HistoryEntry, Release
from gateway.store.session_record import SessionState

MAX_CONNECTIONS = 32  # Redis runs one command at a time: more mostly adds connect storms


def _limit(value: int | None) -> str:
    return "" if value is None else str(value)


def _head(raw: list[Any]) -> AuditHead:
    seq, digest = raw
    return AuditHead(0, "") if seq is None else AuditHead(int(seq), (digest or b"").decode())


def _admit_result(raw: dict[str, Any], request: AdmitRequest) -> AdmitResult:
    usage = {
        name: ScopeUsage(
            requests_remaining=u.get("requests_remaining"),
            requests_reset_s=float(u.get("requests_reset_s", 0.0)),
            tokens_remaining=u.get("tokens_remaining"),
            tokens_reset_s=float(u.get("tokens_reset_s", 0.0)),
        )
        for name, u in raw["usage"].items()
    }
    if not raw["admitted"]:
        return AdmitResult(
            admitted=False,
            denied_scope=raw["denied_scope"],
            denied_limit=raw["denied_limit"],
            retry_after_s=float(raw["retry_after"]),
            usage=usage,
        )
    second, day = int(raw["second"]), int(raw["day"])
    reservation = Reservation(request.lease_id, request.tokens, second, day)
    return AdmitResult(admitted=True, reservation=reservation, usage=usage)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _key_record(raw: bytes | str, key_id: str) -> KeyRecord:
    with stored("API key", key_id):
        return KeyRecord.from_json(raw)


def _sorted_records(raw: dict[str, bytes | str | None], tenant: str | None) -> list[KeyRecord]:
    records = [_key_record(record, key_id) for key_id, record in raw.items() if record is not None]
    # A tenant's id set may still name a key that moved to another tenant.
    records = [r for r in records if tenant is None or r.tenant == tenant]
    return sorted(records, key=lambda r: (r.created_at, r.id))


def _single(settings: RedisStoreSettings, max_connections: int) -> Redis:
    # A blocking pool queues bursts (hundreds of concurrent admits) instead of failing them.
    # Maintenance notifications off: while they are on ("auto", redis-py 8.1's default) the pool
    # hands out a pooled connection without checking whether the server closed it, so after a
    # Redis restart every idle connection fails the next call made on it. The calls are not
    # retried (an admit or an append must not run twice), so that check is what recovers them.
    pool = BlockingConnectionPool.from_url(
        settings.url,
        max_connections=max_connections,
        timeout=settings.pool_wait_s,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )
    return Redis.from_pool(pool)


def _cluster(settings: RedisStoreSettings, max_connections: int) -> ClusterClient:
    # The cluster client follows MOVED/ASK redirections and, after a connection error, reloads
    # the slot map on the next call: a failover costs the calls in flight, not the client.
    client = ClusterClient.from_url(
        settings.url,
        max_connections=max_connections,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    assert isinstance(client, ClusterClient)  # from_url builds cls(...): typed as the base class
    client.gateway_pool_wait_s = settings.pool_wait_s
    return client


class RedisStore:
    def __init__(self, settings: RedisStoreSettings, *, max_connections: int = MAX_CONNECTIONS) -> None:
        self._prefix = settings.key_prefix
        self._outcomes = CallOutcomes(settings.readiness)
        build = _cluster if settings.cluster else _single
        self._redis: Client = build(settings, max_connections)
        self._admit = script(self._redis, "admit")
        self._settle = script(self._redis, "settle")
        self._renew = script(self._redis, "renew")
        self._put_key = script(self._redis, "put_key")
        self._find_key = script(self._redis, "find_key")
        self._audit_append = script(self._redis, "audit_append")
        self._sessions = RedisSessions(self._redis, self._prefix, self._outcomes)
        self._approvals = RedisApprovals(self._redis, self._prefix, self._outcomes)
        self._releases = RedisReleases(self._redis, self._prefix, self._outcomes)

    # --- API keys -------------------------------------------------------------------------
    async def put_key(self, record: KeyRecord) -> None:
        names = [
            keys.key_records(self._prefix),
            keys.key_digests(self._prefix),
            keys.tenant_key_ids(self._prefix, record.tenant),
        ]
        with unavailable("put_key", self._outcomes):
            await self._put_key(keys=names, args=[record.id, record.digest, orjson.dumps(record.to_dict())])

    async def get_key(self, key_id: str) -> KeyRecord | None:
        with unavailable("get_key", self._outcomes):
            raw = await self._redis.hget(keys.key_records(self._prefix), key_id)
        return None if raw is None else _key_record(raw, key_id)

    async def find_key(self, digest: str) -> KeyRecord | None:
        names = [keys.key_records(self._prefix), keys.key_digests(self._prefix)]
        with unavailable("find_key", self._outcomes):
            raw = await self._find_key(keys=names, args=[digest])
        # Named by its digest's start, which the caller can compute from its own secret.
        record = None if raw is None else _key_record(raw, f"with digest {digest[:12]}")
        return record if record is not None and record.digest == digest else None

    async def list_keys(self, tenant: str | None) -> list[KeyRecord]:
        records = keys.key_records(self._prefix)
        raw: dict[str, bytes | str | None] = {}
        with unavailable("list_keys", self._outcomes):
            if tenant is None:
                raw = {_text(key_id): record for key_id, record in (await self._redis.hgetall(records)).items()}
            else:
                members = await self._redis.smembers(keys.tenant_key_ids(self._prefix, tenant))
                ids = sorted(_text(key_id) for key_id in members)
                if ids:
                    raw = dict(zip(ids, await self._redis.hmget(records, ids), strict=True))
        return _sorted_records(raw, tenant)

    # --- quotas ---------------------------------------------------------------------------
    async def admit(self, request: AdmitRequest) -> AdmitResult:
        names: list[str] = []
        args: list[str | int | float] = [
            WINDOW_S,
            keys.WINDOW_TTL_S,
            keys.DAILY_TTL_S,
            keys.LEASE_TTL_MARGIN_S,
            request.lease_id,
            request.tokens,
            request.lease_ttl_s,
        ]
        for scope in request.scopes:
            scope_keys = keys.scope_keys(self._prefix, request.tenant, scope.name)
            names += [scope_keys.requests, scope_keys.tokens, scope_keys.daily, scope_keys.leases]
            limits = scope.limits
            args += [scope.name, *map(_limit, (limits.rpm, limits.tpm, limits.daily_tokens, limits.max_concurrency))]
        with unavailable("admit", self._outcomes):
            raw = await self._admit(keys=names, args=args)
        return _admit_result(orjson.loads(raw), request)

    async def settle(
        self, tenant: str, scopes: tuple[QuotaScope, ...], reservation: Reservation, used_tokens: int
    ) -> None:
        names: list[str] = []
        for scope in scopes:
            scope_keys = keys.scope_keys(self._prefix, tenant, scope.name)
            names += [scope_keys.tokens, scope_keys.daily, scope_keys.leases]
        delta = used_tokens - reservation.tokens
        args: list[str | int] = [WINDOW_S, reservation.lease_id, reservation.second, reservation.day, delta]
        with unavailable("settle", self._outcomes):
            await self._settle(keys=names, args=args)

    async def renew_lease(self, tenant: str, scopes: tuple[QuotaScope, ...], lease_id: str, ttl_s: float) -> None:
        names = [keys.scope_keys(self._prefix, tenant, scope.name).leases for scope in scopes]
        with unavailable("renew_lease", self._outcomes):
            await self._renew(keys=names, args=[lease_id, ttl_s, keys.LEASE_TTL_MARGIN_S])

    # --- audit chain ----------------------------------------------------------------------
    async def audit_head(self) -> AuditHead:
        with unavailable("audit_head", self._outcomes):
            return _head(await self._redis.hmget(keys.audit_head(self._prefix), ["seq", "hash"]))

    async def audit_append(self, expected: AuditHead, records: list[AuditRecord]) -> bool:
        check_batch(expected, records)
        args: list[str | int | bytes] = [expected.seq, expected.hash]
        for record in records:
            args += [record.seq, record.hash, canonical(record.to_dict())]
        names = [keys.audit_head(self._prefix), keys.audit_stream(self._prefix)]
        with unavailable("audit_append", self._outcomes):
            return bool(await self._audit_append(keys=names, args=args))

    async def audit_range(self, first_seq: int, limit: int) -> list[AuditRecord]:
        if limit <= 0:
            return []
        start = keys.stream_id(max(first_seq, 0))
        with unavailable("audit_range", self._outcomes):
            entries = await self._redis.xrange(keys.audit_stream(self._prefix), min=start, count=limit)
        with stored("audit record", f"from seq {first_seq}"):
            return [AuditRecord.from_json(fields[b"r"]) for _, fields in entries or [] if fields]

    async def audit_trim(self, before_seq: int, anchor: AuditHead) -> None:
        with unavailable("audit_trim", self._outcomes):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xtrim(keys.audit_stream(self._prefix), minid=keys.stream_id(before_seq), approximate=False)
                pipe.hset(keys.audit_anchor(self._prefix), mapping={"seq": anchor.seq, "hash": anchor.hash})
                await pipe.execute()

    async def audit_anchor(self) -> AuditHead:
        with unavailable("audit_anchor", self._outcomes):
            return _head(await self._redis.hmget(keys.audit_anchor(self._prefix), ["seq", "hash"]))

    # --- sessions -------------------------------------------------------------------------
    async def session_save(self, tenant: str, session_id: str, state: SessionState, ttl_s: float) -> None:
        await self._sessions.save(tenant, session_id, state, ttl_s)

    async def session_load(self, tenant: str, session_id: str) -> SessionState | None:
        return await self._sessions.load(tenant, session_id)

    async def session_append(self, tenant: str, session_id: str, events: list[tuple[int, bytes]], ttl_s: float) -> None:
        await self._sessions.append(tenant, session_id, events, ttl_s)

    async def session_events(self, tenant: str, session_id: str, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        return await self._sessions.events(tenant, session_id, after_seq, limit)

    async def session_claim(self, tenant: str, session_id: str, owner: str, ttl_s: float) -> bool:
        return await self._sessions.claim(tenant, session_id, owner, ttl_s)

    async def session_release(self, tenant: str, session_id: str, owner: str) -> None:
        await self._sessions.release(tenant, session_id, owner)

    async def session_checkpoint(self, items: list[SessionCheckpoint]) -> None:
        await self._sessions.checkpoint(items)

    async def session_open(self, first: SessionCheckpoint) -> bool:
        return await self._sessions.open(first)

    async def session_delete(self, tenant: str, session_id: str) -> bool:
        return await self._sessions.delete(tenant, session_id)

    # --- approvals ------------------------------------------------------------------------
    async def approval_put(self, record: Approval, ttl_s: float) -> None:
        await self._approvals.put(record, ttl_s)

    async def approval_put_within(self, record: Approval, ttl_s: float, caps: PendingCaps) -> str | None:
        return await self._approvals.put(record, ttl_s, caps)

    async def approval_get(self, tenant: str, approval_id: str) -> Approval | None:
        return await self._approvals.get(tenant, approval_id)

    async def approval_decide(self, tenant: str, approval_id: str, decision: Decision) -> tuple[bool, Approval | None]:
        return await self._approvals.decide(tenant, approval_id, decision)

    async def approval_list(self, tenant: str | None, status: str | None, limit: int) -> list[Approval]:
        return await self._approvals.list(tenant, status, limit)

    async def approval_redeem(self, tenant: str, approval_id: str) -> bool:
        return await self._approvals.redeem(tenant, approval_id)

    # --- releases -------------------------------------------------------------------------
    async def release_put(self, record: Release) -> bool:
        return await self._releases.put(record)

    async def release_get(self, model: str, version: str) -> Release | None:
        return await self._releases.get(model, version)

    async def release_list(self, model: str) -> list[Release]:
        return await self._releases.list_releases(model)

    async def release_active(self, model: str) -> tuple[str | None, int]:
        return await self._releases.active(model)

    async def release_activate(
        self, model: str, version: str, expected_generation: int, entry: HistoryEntry
    ) -> tuple[bool, int]:
        return await self._releases.activate(model, version, expected_generation, entry)

    async def release_history(self, model: str, limit: int) -> list[HistoryEntry]:
        return await self._releases.history(model, limit)

    async def release_generations(self) -> dict[str, int]:
        return await self._releases.generations()

    async def release_canary(self, model: str) -> Canary | None:
        return await self._releases.canary(model)

    async def release_set_canary(self, model: str, canary: Canary | None, expected_generation: int) -> tuple[bool, int]:
        return await self._releases.set_canary(model, canary, expected_generation)

    # --- lifecycle ------------------------------------------------------------------------
    async def store_epoch(self, candidate: str) -> str:
        with unavailable("store_epoch", self._outcomes):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(keys.store_epoch(self._prefix), candidate, nx=True)
                pipe.get(keys.store_epoch(self._prefix))
                _, epoch = await pipe.execute()
        return epoch.decode() if isinstance(epoch, bytes) else str(epoch)

    def failing(self) -> str | None:
        return self._outcomes.problem()

    async def ping(self) -> None:
        with unavailable("ping", self._outcomes):
            await self._redis.ping()

    async def aclose(self) -> None:
        with unavailable("close", self._outcomes):
            await self._redis.aclose()
