"""Approvals in Redis: every key under the one tag `approvals` (see gateway/store/keys.py), every
call one script that reads the server's clock (TIME), so that replicas with skewed clocks agree
on whether an approval has expired. The record is kept byte for byte as put and the decision
beside it: no script re-encodes JSON (cjson would round floats and turn [] into {}).
"""

from __future__ import annotations

from gateway.store import approval_record as approvals
from gateway.store import keys
from gateway.store.approval_record import Approval, Decision, PendingCaps
from gateway.store.call_outcomes import CallOutcomes
from gateway.store.redis_common import Client, script, unavailable

_CAP_REACHED = {-1: "key", -2: "tenant"}  # what approval_put.lua answers when a cap refused the put


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _read(key: str, record: bytes | str, decision: bytes | str, state: bytes | str) -> Approval:
    return approvals.read(record, decision or None, _text(state), key)


class RedisApprovals:
    def __init__(self, redis: Client, prefix: str, outcomes: CallOutcomes) -> None:
        self._outcomes = outcomes
        self._prefix = prefix
        self._keys = keys.approval_keys(prefix)
        self._put = script(redis, "approval_put")
        self._get = script(redis, "approval_get")
        self._decide = script(redis, "approval_decide")
        self._list = script(redis, "approval_list")
        self._redeem = script(redis, "approval_redeem")

    def _record_keys(self) -> list[str]:
        return [self._keys.records, self._keys.decisions, self._keys.deadlines, self._keys.forget]

    async def put(self, record: Approval, ttl_s: float, caps: PendingCaps | None = None) -> str | None:
        """None if stored (or left as it was); with `caps`, the cap reached: "key" or "tenant"."""
        new = approvals.check_put(record, ttl_s)
        names = [
            *self._record_keys(),
            self._keys.order,
            keys.approval_tenant_index(self._prefix, new.tenant),
            keys.approval_pending(self._prefix, new.tenant),
            self._keys.pending_keys,
        ]
        args: list[str | float | int | bytes] = [
            keys.approval_member(new.tenant, new.id),
            new.blob,
            repr(new.requested_at),
            repr(new.expires_at),
            repr(new.forget_at),
            keys.approval_forget_ms(new.forget_at),
            keys.approval_tenant_index_base(self._prefix),
            keys.APPROVAL_PURGE_BATCH,
            caps.per_key if caps else 0,
            caps.per_tenant if caps else 0,
            new.key_id,
            keys.approval_pending_base(self._prefix),
        ]
        with unavailable("approval_put", self._outcomes):
            stored = int(await self._put(keys=names, args=args))
        return _CAP_REACHED.get(stored)

    async def get(self, tenant: str, approval_id: str) -> Approval | None:
        with unavailable("approval_get", self._outcomes):
            raw = await self._get(keys=self._record_keys(), args=[keys.approval_member(tenant, approval_id)])
        return None if raw is None else _read(approval_id, *raw)

    async def decide(self, tenant: str, approval_id: str, decision: Decision) -> tuple[bool, Approval | None]:
        blob = approvals.check_decision(decision)
        args: list[str | bytes] = [keys.approval_member(tenant, approval_id), blob]
        names = [*self._record_keys(), keys.approval_pending(self._prefix, tenant), self._keys.pending_keys]
        with unavailable("approval_decide", self._outcomes):
            raw = await self._decide(keys=names, args=args)
        if raw is None:
            return False, None
        won, *stored = raw
        return bool(won), _read(approval_id, *stored)

    async def redeem(self, tenant: str, approval_id: str) -> bool:
        args = [keys.approval_member(tenant, approval_id)]
        with unavailable("approval_redeem", self._outcomes):
            return int(await self._redeem(keys=[self._keys.decisions, self._keys.forget], args=args)) == 1

    async def list(self, tenant: str | None, status: str | None, limit: int) -> list[Approval]:
        approvals.check_status(status)
        if limit <= 0:
            return []
        index = self._keys.order if tenant is None else keys.approval_tenant_index(self._prefix, tenant)
        names = [index, *self._record_keys()]
        with unavailable("approval_list", self._outcomes):
            raw = await self._list(keys=names, args=[status or "", limit, keys.APPROVAL_LIST_CHUNK])
        return [_read("in a list", *raw[i : i + 3]) for i in range(0, len(raw), 3)]
