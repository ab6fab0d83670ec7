"""Sessions in Redis: three keys per session on one slot (see gateway/store/keys.py).

State is a string key, the event log a stream with explicit ids `<seq>-0`, the lease a string
holding its owner with a PX expiry. Every call is one command or one script: one round trip.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from redis.asyncio.client import Pipeline

from gateway.store import keys
from gateway.store.base import SessionCheckpoint
from gateway.store.call_outcomes import CallOutcomes
from gateway.store.fields import stored
from gateway.store.redis_common import Client, ClusterClient, script, unavailable
from gateway.store.session_batch import check_events, check_open, check_ttl
from gateway.store.session_record import SessionState


def _event(entry_id: bytes | str, fields: dict[Any, Any]) -> tuple[int, bytes]:
    payload = fields[b"e"]
    return keys.event_seq(entry_id), payload if isinstance(payload, bytes) else str(payload).encode()


class RedisSessions:
    def __init__(self, redis: Client, prefix: str, outcomes: CallOutcomes) -> None:
        self._outcomes = outcomes
        self._redis = redis
        self._prefix = prefix
        self._save = script(redis, "session_save")
        self._append = script(redis, "session_append")
        self._claim = script(redis, "session_claim")
        self._release = script(redis, "session_release")

    def _keys(self, tenant: str, session_id: str) -> keys.SessionKeys:
        return keys.session_keys(self._prefix, tenant, session_id)

    async def save(self, tenant: str, session_id: str, state: SessionState, ttl_s: float) -> None:
        check_ttl(ttl_s)
        names = self._keys(tenant, session_id)
        args: list[bytes | int] = [state.to_json(), keys.session_ttl_ms(ttl_s)]
        with unavailable("session_save", self._outcomes):
            await self._save(keys=[names.state, names.events, names.lease], args=args)

    async def load(self, tenant: str, session_id: str) -> SessionState | None:
        with unavailable("session_load", self._outcomes):
            raw = await self._redis.get(self._keys(tenant, session_id).state)
        if raw is None:
            return None
        with stored("session state", session_id):
            return SessionState.from_json(raw)

    async def append(self, tenant: str, session_id: str, events: list[tuple[int, bytes]], ttl_s: float) -> None:
        check_ttl(ttl_s)
        check_events(events)
        names = self._keys(tenant, session_id)
        args: list[int | bytes] = [keys.session_ttl_ms(ttl_s)]
        for seq, payload in events:
            args += [seq, payload]
        with unavailable("session_append", self._outcomes):
            await self._append(keys=[names.events, names.state, names.lease], args=args)

    async def events(self, tenant: str, session_id: str, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        if limit <= 0:
            return []
        start = "(" + keys.stream_id(max(after_seq, 0))  # exclusive
        with unavailable("session_events", self._outcomes):
            entries = await self._redis.xrange(self._keys(tenant, session_id).events, min=start, count=limit)
        return [_event(entry_id, fields) for entry_id, fields in entries or [] if entry_id and fields]

    async def claim(self, tenant: str, session_id: str, owner: str, ttl_s: float) -> bool:
        check_ttl(ttl_s)
        lease = self._keys(tenant, session_id).lease
        with unavailable("session_claim", self._outcomes):
            return bool(await self._claim(keys=[lease], args=[owner, keys.session_ttl_ms(ttl_s)]))

    async def release(self, tenant: str, session_id: str, owner: str) -> None:
        lease = self._keys(tenant, session_id).lease
        with unavailable("session_release", self._outcomes):
            await self._release(keys=[lease], args=[owner])

    async def checkpoint(self, items: list[SessionCheckpoint]) -> None:
        """Every item's scripts in one pipeline: one round trip for all live sessions."""
        if not items:
            return
        for item in items:
            check_ttl(item.ttl_s)
            check_events(item.events)
        # `async with`, not a bare pipeline: redis-py checks SCRIPT EXISTS on a connection of its
        # own before the pipeline's try/finally, so when that check fails (Redis frozen, loading,
        # restarting) only the pipeline's reset() gives the connection back. Without it every
        # failure leaked one pooled connection until the pool was empty for good (issue 12).
        with unavailable("session_checkpoint", self._outcomes):
            if isinstance(self._redis, ClusterClient):
                # Sessions live on many slots (nodes): one call per session, all at once.
                await asyncio.gather(*(self._one(self._redis, item) for item in items))
                return
            async with self._redis.pipeline(transaction=False) as pipe:
                for item in items:
                    await self._one(pipe, item)
                await pipe.execute()

    async def _one(self, pipe: Pipeline | ClusterClient, item: SessionCheckpoint) -> None:
        """Queue `item`'s calls on a pipeline, or make them (in order) on a cluster client."""
        names = self._keys(item.tenant, item.session_id)
        ttl_ms = keys.session_ttl_ms(item.ttl_s)
        if item.replace_events:
            deleted = pipe.delete(names.events)
            if isinstance(pipe, ClusterClient):
                await deleted
        if item.state is not None:
            state_args: list[bytes | int] = [item.state.to_json(), ttl_ms]
            await self._save(keys=[names.state, names.events, names.lease], args=state_args, client=pipe)
        if item.events:
            args: list[int | bytes] = [ttl_ms]
            for seq, payload in item.events:
                args += [seq, payload]
            await self._append(keys=[names.events, names.state, names.lease], args=args, client=pipe)
        if item.renew_owner is not None:
            lease_ms = keys.session_ttl_ms(item.lease_ttl_s)
            await self._claim(keys=[names.lease], args=[item.renew_owner, lease_ms], client=pipe)
        if item.release_owner is not None:
            await self._release(keys=[names.lease], args=[item.release_owner], client=pipe)

    async def open(self, first: SessionCheckpoint) -> bool:
        """Two round trips, the claim first: only a won claim writes the rest."""
        check_open(first)
        assert first.renew_owner is not None
        if not await self.claim(first.tenant, first.session_id, first.renew_owner, first.lease_ttl_s):
            return False
        await self.checkpoint([replace(first, renew_owner=None)])
        return True

    async def delete(self, tenant: str, session_id: str) -> bool:
        names = self._keys(tenant, session_id)
        with unavailable("session_delete", self._outcomes):
            return bool(await self._redis.delete(names.state, names.events, names.lease))
