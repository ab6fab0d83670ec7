"""Human approval of high-risk tool calls: requested by the policy stage, decided by a person.

An approval binds the exact call: tool name and the SHA-256 of its canonical arguments. Approving
issues a token (HMAC over approval id, tool, argument hash and expiry) that travels with the
released call, so a tool server can check with `policies.verify_approval_token` that what it is
about to run is what was approved. Expiry counts as rejection. An approver needs the `approver`
scope in the same tenant and may not approve a call made with their own key; of two concurrent
decisions exactly one wins (the store decides atomically).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any

from gateway.audit import AuditWriter
from gateway.errors import Conflict, NotFound, PermissionDenied
from gateway.principal import Principal, Scope
from gateway.store.base import Store
from policies import NeedsApproval, arguments_sha256, issue_approval_token

PENDING, APPROVED, REJECTED, EXPIRED = "pending", "approved", "rejected", "expired"
_KEEP_AFTER_EXPIRY_S = 7 * 86_400  # decided approvals stay readable for the audit trail


class ApprovalService:
    def __init__(
        self, store: Store, audit: AuditWriter, secret: bytes, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._audit = audit
        self._secret = secret
        self._clock = clock

    @property
    def secret(self) -> bytes:
        return self._secret

    async def request(
        self, principal: Principal, session_id: str | None, call_id: str, tool: str, arguments: str, need: NeedsApproval
    ) -> dict[str, Any]:
        now = self._clock()
        record = {
            "id": f"appr_{secrets.token_hex(10)}",
            "tenant": principal.tenant,
            "key_id": principal.key_id,
            "session_id": session_id,
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "arguments_sha256": arguments_sha256(arguments),
            "reason": f"'{tool}' is a high-risk tool",
            "mode": need.mode.value,
            "requested_at": now,
            "expires_at": now + need.ttl_s,
            "status": PENDING,
        }
        await self._store.approval_put(record, _KEEP_AFTER_EXPIRY_S)
        return record

    async def lookup(self, tenant: str, approval_id: str) -> dict[str, Any]:
        record = await self._store.approval_get(tenant, approval_id)
        if record is None:
            raise NotFound(f"approval '{approval_id}' not found")
        return record

    async def wait(self, tenant: str, approval_id: str, timeout_s: float, poll_s: float) -> dict[str, Any]:
        """The record once decided or expired; after `timeout_s` still pending counts as expired."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = await self.lookup(tenant, approval_id)
            if record["status"] != PENDING:
                return record
            if time.monotonic() >= deadline:
                return {**record, "status": EXPIRED}
            await asyncio.sleep(poll_s)

    async def get(self, actor: Principal, approval_id: str) -> dict[str, Any]:
        record = await self._find(actor, approval_id)
        return public_view(record)

    async def list(self, actor: Principal, status: str | None, limit: int = 100) -> list[dict[str, Any]]:
        actor.require(Scope.APPROVER)
        tenant = None if actor.all_tenants else actor.tenant
        return [public_view(r) for r in await self._store.approval_list(tenant, status, limit)]

    async def decide(self, actor: Principal, approval_id: str, *, approve: bool, reason: str = "") -> dict[str, Any]:
        record = await self._find(actor, approval_id)
        if record["key_id"] == actor.key_id:
            raise PermissionDenied("a call may not be approved or rejected with the key that made it")
        decision: dict[str, Any] = {
            "status": APPROVED if approve else REJECTED,
            "decided_by": actor.key_id,
            "decided_at": self._clock(),
            "decision_reason": reason,
        }
        if approve:
            decision["token"] = issue_approval_token(
                self._secret,
                record["id"],
                record["tool"],
                record["arguments_sha256"],
                record["expires_at"],
                key_id=record["key_id"],
                tenant=record["tenant"],
            )
        won, current = await self._store.approval_decide(record["tenant"], approval_id, decision)
        if not won:
            status = current["status"] if current else "gone"
            raise Conflict(f"approval '{approval_id}' is already {status}")
        assert current is not None
        await self._audit.submit(
            {
                "kind": "admin",
                "action": f"approval.{decision['status']}",
                "actor": actor.key_id,
                "tenant": record["tenant"],
                "target": approval_id,
                "before": {"status": PENDING},
                "after": {
                    "status": decision["status"],
                    "tool": record["tool"],
                    "arguments_sha256": record["arguments_sha256"],
                },
                "reason": reason,
            }
        )
        return public_view(current)

    async def _find(self, actor: Principal, approval_id: str) -> dict[str, Any]:
        actor.require(Scope.APPROVER)
        if actor.all_tenants:
            found = [r for r in await self._store.approval_list(None, None, 10_000) if r["id"] == approval_id]
            record = found[0] if found else None
        else:
            record = await self._store.approval_get(actor.tenant, approval_id)
        if record is None:
            raise NotFound(f"approval '{approval_id}' not found")  # another tenant's id does not exist here
        return record


def public_view(record: dict[str, Any]) -> dict[str, Any]:
    """What an approver sees: everything but the token, which only the released call carries."""
    return {k: v for k, v in record.items() if k != "token"}
