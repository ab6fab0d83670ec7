"""Human approval of high-risk tool calls: requested by the policy stage, decided by a person.

An approval binds the exact call: tool name and the SHA-256 of its canonical arguments. Approving
issues a token (HMAC over approval id, tool, argument hash and expiry) that travels with the
released call, so a tool server can check with `policies.verify_approval_token` that what it is
about to run is what was approved. Expiry counts as rejection; a wait that ends undecided expires
the approval in the store. A deferred call is collected once, by the key that asked, with the
conversation that led to it. An approver needs the `approver`
scope in the same tenant and may not approve a call made with their own key; of two concurrent
decisions exactly one wins (the store decides atomically).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from gateway.audit.writer import AuditWriter
from gateway.core.principal import Principal, Scope
from gateway.errors import Conflict, InvalidRequest, NotFound, PermissionDenied, TooManyPendingApprovals
from gateway.store.approval_record import Approval, Decision, ExcerptMessage, PendingCaps
from gateway.store.base import ApprovalStore
from policies import ApprovalMode, NeedsApproval, arguments_sha256, issue_approval_token

PENDING, APPROVED, REJECTED, EXPIRED = "pending", "approved", "rejected", "expired"
_KEEP_AFTER_EXPIRY_S = 7 * 86_400  # decided approvals stay readable for the audit trail
DEFAULT_CAPS = PendingCaps(per_key=10, per_tenant=100)  # tools.max_pending_approvals_* defaults
# Retry-After of a call refused over a cap: a decision can come any moment, so no longer.
_RETRY_OVER_CAP_S = 1.0


class ApprovalService:
    def __init__(
        self,
        store: ApprovalStore,
        audit: AuditWriter,
        secret: bytes,
        *,
        caps: PendingCaps = DEFAULT_CAPS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._audit = audit
        self._secret = secret
        self._caps = caps
        self._clock = clock

    @property
    def secret(self) -> bytes:
        return self._secret

    async def request(
        self,
        principal: Principal,
        session_id: str | None,
        call_id: str,
        tool: str,
        arguments: str,
        need: NeedsApproval,
        conversation: list[dict[str, Any]] | None = None,
        policy_name: str | None = None,
        channel: str = "chat",
    ) -> Approval:
        """Hold a call for a person. `channel` is where the decided call goes: "chat" (the answer,
        or a later request with X-Approval-Id) or "mcp" (only the MCP call that is waiting).
        TooManyPendingApprovals when the key or its tenant has as many pending as its cap allows
        (the store checks and stores in one step, so racing calls cannot pass it)."""
        now = self._clock()
        record = Approval(
            id=f"appr_{secrets.token_hex(10)}",
            tenant=principal.tenant,
            key_id=principal.key_id,
            session_id=session_id,
            call_id=call_id,
            tool=tool,
            arguments=arguments,
            arguments_sha256=arguments_sha256(arguments),
            reason=f"'{tool}' is a high-risk tool",
            mode=need.mode.value,
            requested_at=now,
            expires_at=now + need.ttl_s,
            status=PENDING,
            conversation_sha256=conversation_sha256(conversation or []),
            # What an approver needs to judge the call: where it came from and which rule held it.
            excerpt=excerpt(conversation or []),
            policy=policy_name,
            risk=need.rule.risk.value,
            channel=channel,
            wait_deadline=now + need.timeout_s if need.mode is ApprovalMode.WAIT else None,
        )
        reached = await self._store.approval_put_within(record, _KEEP_AFTER_EXPIRY_S, self._caps)
        if reached is not None:
            raise self._over_cap(tool, reached)
        return record

    def _over_cap(self, tool: str, reached: str) -> TooManyPendingApprovals:
        who, cap, setting = (
            ("this key", self._caps.per_key, "per_key")
            if reached == "key"
            else ("this key's tenant", self._caps.per_tenant, "per_tenant")
        )
        return TooManyPendingApprovals(
            f"The gateway refused to hold the call to '{tool}' for approval: {who} already has {cap} calls "
            f"waiting for a decision (tools.max_pending_approvals_{setting}). Try again once one is decided.",
            retry_after_s=_RETRY_OVER_CAP_S,
        )

    async def lookup(self, tenant: str, approval_id: str) -> Approval:
        record = await self._store.approval_get(tenant, approval_id)
        if record is None:
            raise NotFound(f"approval '{approval_id}' not found")
        return record

    async def wait(self, tenant: str, approval_id: str, timeout_s: float, poll_s: float) -> Approval:
        """The record once decided or expired. Still pending after `timeout_s`, it is expired in the
        store: nobody waits for the decision any more, so a late approval must not succeed."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = await self.lookup(tenant, approval_id)
            if record.status != PENDING:
                return record
            if time.monotonic() >= deadline:
                return await self._expire(record, f"nobody decided within the wait ({timeout_s:g}s)")
            await asyncio.sleep(poll_s)

    async def withdraw(self, record: Approval, reason: str) -> Approval:
        """Nobody waits for this decision any more (the caller went away): expire it if pending."""
        return await self._expire(record, reason)

    async def _expire(self, record: Approval, reason: str) -> Approval:
        decision = Decision(EXPIRED, decided_by="gateway", decided_at=self._clock(), decision_reason=reason)
        won, current = await self._store.approval_decide(record.tenant, record.id, decision)
        if not won:  # decided at the last moment (or lapsed): that stands
            return current or replace(record, status=EXPIRED)
        await self._audit.submit(
            {
                "kind": "admin",
                "action": "approval.expired",
                "actor": "gateway",
                "tenant": record.tenant,
                "target": record.id,
                "before": {"status": PENDING},
                "after": {"status": EXPIRED, "tool": record.tool, "arguments_sha256": record.arguments_sha256},
                "reason": reason,
            }
        )
        return current or record.decided(decision)

    async def status(self, principal: Principal, approval_id: str) -> dict[str, Any]:
        """For the agent that asked: where its held call stands (not the call: that is delivered)."""
        record = await self._store.approval_get(principal.tenant, approval_id)
        if record is None or record.key_id != principal.key_id:
            raise NotFound(f"approval '{approval_id}' not found")
        return {
            "id": record.id,
            "tool": record.tool,
            "mode": record.mode,
            "status": record.status,
            "requested_at": record.requested_at,
            "wait_deadline": record.wait_deadline,
            "expires_at": record.expires_at,
            "decided_at": record.decided_at,
            "decision_reason": record.decision_reason,
        }

    async def collect(self, principal: Principal, approval_id: str, conversation: list[dict[str, Any]]) -> Approval:
        """The decided approval, for the key that asked and the conversation that led to it, once."""
        record = await self.lookup(principal.tenant, approval_id)
        if record.key_id != principal.key_id or record.channel != "chat":
            # The released call carries a token tool servers trust: only the requester may collect
            # it, and an MCP call's approval goes to that call alone.
            raise NotFound(f"approval '{approval_id}' not found")
        if record.conversation_sha256 not in (None, conversation_sha256(conversation)):
            raise InvalidRequest(
                f"approval '{approval_id}' belongs to another conversation: send the messages of the request"
                " that made the call",
                param="messages",
            )
        if record.status == PENDING:
            return record
        if not await self._store.approval_redeem(record.tenant, approval_id):
            raise Conflict(f"approval '{approval_id}' was already collected")
        return record

    async def get(self, actor: Principal, approval_id: str) -> dict[str, Any]:
        record = await self._find(actor, approval_id)
        return public_view(record)

    async def list(self, actor: Principal, status: str | None, limit: int = 100) -> list[dict[str, Any]]:
        actor.require(Scope.APPROVER)
        tenant = None if actor.all_tenants else actor.tenant
        return [public_view(r) for r in await self._store.approval_list(tenant, status, limit)]

    async def decide(self, actor: Principal, approval_id: str, *, approve: bool, reason: str = "") -> dict[str, Any]:
        record = await self._find(actor, approval_id)
        if record.key_id == actor.key_id:
            await self._audit.submit(
                {
                    "kind": "admin",
                    "action": "approval.self_approval_refused",
                    "actor": actor.key_id,
                    "tenant": record.tenant,
                    "target": approval_id,
                    "before": {"status": record.status},
                    "after": {"status": record.status, "tool": record.tool},
                    "reason": f"tried to {'approve' if approve else 'reject'} its own call",
                }
            )
            raise PermissionDenied("a call may not be approved or rejected with the key that made it")
        token = None
        if approve:
            token = issue_approval_token(
                self._secret,
                record.id,
                record.tool,
                record.arguments_sha256,
                record.expires_at,
                key_id=record.key_id,
                tenant=record.tenant,
            )
        status = APPROVED if approve else REJECTED
        decision = Decision(
            status, decided_by=actor.key_id, decided_at=self._clock(), decision_reason=reason, token=token
        )
        won, current = await self._store.approval_decide(record.tenant, approval_id, decision)
        if not won:
            status = current.status if current else "gone"
            raise Conflict(f"approval '{approval_id}' is already {status}")
        assert current is not None
        await self._audit.submit(
            {
                "kind": "admin",
                "action": f"approval.{decision.status}",
                "actor": actor.key_id,
                "tenant": record.tenant,
                "target": approval_id,
                "before": {"status": PENDING},
                "after": {"status": decision.status, "tool": record.tool, "arguments_sha256": record.arguments_sha256},
                "reason": reason,
            }
        )
        return public_view(current)

    async def _find(self, actor: Principal, approval_id: str) -> Approval:
        actor.require(Scope.APPROVER)
        if actor.all_tenants:
            found = [r for r in await self._store.approval_list(None, None, 10_000) if r.id == approval_id]
            record = found[0] if found else None
        else:
            record = await self._store.approval_get(actor.tenant, approval_id)
        if record is None:
            raise NotFound(f"approval '{approval_id}' not found")  # another tenant's id does not exist here
        return record


_EXCERPT_MESSAGES = 4
_EXCERPT_CHARS = 400


def excerpt(messages: list[dict[str, Any]]) -> tuple[ExcerptMessage, ...]:
    """The last few messages that led to the call, each cut short, for the approver."""
    shown = []
    for message in messages[-_EXCERPT_MESSAGES:]:
        content = message.get("content")
        if not isinstance(content, str):  # parts, or a tool call without text
            content = orjson.dumps(content).decode() if content else ""
        text = content if len(content) <= _EXCERPT_CHARS else content[: _EXCERPT_CHARS - 1] + "…"
        shown.append(ExcerptMessage(str(message.get("role")), text))
    return tuple(shown)


def conversation_sha256(messages: list[dict[str, Any]]) -> str:
    """The conversation an approval belongs to: its messages but the system ones (a release's
    prompt may change between the request and the collection)."""
    kept = [m for m in messages if m.get("role") != "system"]
    return hashlib.sha256(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)).hexdigest()


def public_view(record: Approval) -> dict[str, Any]:
    """What an approver sees: everything but the token, which only the released call carries."""
    return {k: v for k, v in record.to_dict().items() if k != "token"}
