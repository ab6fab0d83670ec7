"""Tool calls governed where they run: every MCP call an agent makes through the gateway is
judged by the same policy engine as the tool calls a model proposes in chat completions.

An upstream server's tool `read_file` is shown to agents as `files__read_file` (server name,
two underscores, tool name), so two servers cannot shadow each other and the name is a valid
OpenAI function name; policy rules name tools the same way. For each `tools/call`:

    unknown or unlisted tool          -> error result, audited as deny
    policy denies (whitelist, schema) -> error result naming the reason, audited as deny
    high risk                         -> held for a person (the approvals queue, page, CLI, API),
                                         with progress notifications while held, bounded by the
                                         policy's wait time; rejected or expired -> error result;
                                         the key or tenant at its cap of pending approvals
                                         (tools.max_pending_approvals_*) -> error result at once
    allowed or approved               -> forwarded (an approval's id and token in `_meta`),
                                         result size-limited, audited with its status

Calls are always held in `wait` fashion: an MCP call has one answer, so there is no deferring it.
Errors are tool results with `isError: true`, which agent frameworks hand to the model as the
tool's output, so the agent learns what happened instead of crashing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import mcp_types as types
import orjson

from gateway.approvals.service import APPROVED, ApprovalService
from gateway.approvals.tool_policy import PolicyHolder
from gateway.audit.writer import AuditWriter
from gateway.core.principal import Principal
from gateway.errors import RateLimited, StoreUnavailable, TooManyPendingApprovals
from gateway.mcp.status import UpstreamStatus
from gateway.mcp.upstream import UpstreamCallFailed, UpstreamServer, UpstreamUnavailable
from gateway.quota.stage import Admit
from gateway.settings import McpSettings
from gateway.store.approval_record import Approval
from gateway.tasks import cancel_and_wait
from policies import Allow, ApprovalMode, Deny, NeedsApproval

log = logging.getLogger(__name__)

SEPARATOR = "__"
APPROVAL_META_KEY = "agent-gateway/approval"
ProgressReporter = Callable[[float, str], Awaitable[None]]


@dataclass(slots=True)
class _Trail:
    """What the audit record of one call says, filled in as the call goes."""

    call_id: str
    decision: str = "none"
    status: str = "pending"
    approval_id: str | None = None
    arguments_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class CallOutcome:
    result: types.CallToolResult
    decision: str  # allow, deny, approved, rejected, expired
    # ok, tool_error, denied, invalid_arguments, too_many_pending, not_approved, upstream_unavailable,
    # upstream_error, too_large
    status: str


class McpGateway:
    def __init__(
        self,
        settings: McpSettings,
        policies: PolicyHolder,
        approvals: ApprovalService,
        audit: AuditWriter,
        quota: Admit,
        poll_s: float,
    ) -> None:
        self._settings = settings
        self._quota = quota
        self._policies = policies
        self._approvals = approvals
        self._audit = audit
        self._poll_s = poll_s
        self.servers = {s.name: UpstreamServer(s) for s in settings.servers}
        self._tasks: list[asyncio.Task[None]] = []
        self.calls: dict[tuple[str, str], int] = {}  # (server, status) -> count, read by /metrics

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(s.run(), name=f"mcp-{s.name}") for s in self.servers.values()]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []

    def statuses(self) -> list[UpstreamStatus]:
        return [s.status() for s in self.servers.values()]

    def executes(self, name: str) -> bool:
        """Whether `name` is a tool this gateway runs over MCP (its approval happens at execution)."""
        server, _, tool = name.partition(SEPARATOR)
        upstream = self.servers.get(server)
        return upstream is not None and any(t.name == tool for t in upstream.tools)

    def visible_tools(self, principal: Principal) -> list[types.Tool]:
        """The tools this key may call, namespaced; the others do not exist for it."""
        engine = self._policies.engine
        policy = engine.policy_for(principal.tenant, principal.key_id)
        visible = []
        for server in self.servers.values():
            for tool in server.tools:
                name = f"{server.name}{SEPARATOR}{tool.name}"
                if engine.may_use(policy, name):
                    visible.append(tool.model_copy(update={"name": name}))
        return visible

    async def call(
        self, principal: Principal, name: str, arguments: dict[str, Any], progress: ProgressReporter
    ) -> types.CallToolResult:
        """Judge, hold, forward; one audit record whatever happens (queued in `finally`, so the
        record of a call the client abandoned, or that failed, is written too). The audit queue
        is asked for room first but holds nothing while the call is held for a person."""
        started = time.monotonic()
        trail = _Trail(call_id=f"mcp_{secrets.token_hex(8)}")
        await self._audit.admit()
        try:
            outcome = await self._metered(principal, trail, name, arguments, progress)
            trail.decision, trail.status = outcome.decision, outcome.status
            return outcome.result
        except BaseException:
            trail.status = "cancelled" if trail.status == "pending" else "error"
            raise
        finally:
            server = name.partition(SEPARATOR)[0]
            server = server if server in self.servers else "<unknown>"
            self.calls[(server, trail.status)] = self.calls.get((server, trail.status), 0) + 1
            self._audit.record(
                {
                    "kind": "mcp",
                    "request_id": trail.call_id,
                    "tenant": principal.tenant,
                    "key_id": principal.key_id,
                    "server": server,
                    "tool": name,
                    "decision": trail.decision,
                    "status": trail.status,
                    "approval_id": trail.approval_id,
                    "arguments_sha256": trail.arguments_sha256,
                    "duration_ms": round((time.monotonic() - started) * 1000, 3),
                }
            )

    async def _metered(
        self,
        principal: Principal,
        trail: _Trail,
        name: str,
        arguments: dict[str, Any],
        progress: ProgressReporter,
    ) -> CallOutcome:
        """Counted before it is judged, so that probing for tools costs like any request."""
        try:
            async with self._quota.metered(principal):
                return await self._judge_and_run(principal, trail, name, arguments, progress)
        except RateLimited as limited:
            return _refused(f"{limited.message} (retry after {limited.retry_after_s:g}s)", "none", "rate_limited")
        except StoreUnavailable:
            return _refused("The quota store is unavailable; try again later.", "none", "store_unavailable")

    async def _judge_and_run(
        self,
        principal: Principal,
        trail: _Trail,
        name: str,
        arguments: dict[str, Any],
        progress: ProgressReporter,
    ) -> CallOutcome:
        arguments_json = _encoded(arguments)
        if arguments_json is not None:
            trail.arguments_sha256 = hashlib.sha256(arguments_json.encode()).hexdigest()
        server_name, _, tool = name.partition(SEPARATOR)
        server = self.servers.get(server_name)
        engine = self._policies.engine
        policy = engine.policy_for(principal.tenant, principal.key_id)
        if server is None or not any(t.name == tool for t in server.tools) or not engine.may_use(policy, name):
            # Unlisted and not allowed look the same: a key learns nothing about tools it may not use.
            return _refused(f"Unknown tool: {name}", "deny", "denied")
        if arguments_json is None:
            text = f"The gateway refused the call to '{name}': an integer in its arguments is beyond the 64-bit range."
            return _refused(text, "deny", "invalid_arguments")
        decision = engine.decide(policy, name, arguments_json)
        if isinstance(decision, Deny):
            return _refused(f"The gateway refused the call to '{name}': {decision.reason}", "deny", "denied")
        meta: types.RequestParamsMeta | None = None
        if isinstance(decision, NeedsApproval):
            # An MCP call has one answer, so it is always held as in wait mode.
            decision = dataclasses.replace(decision, mode=ApprovalMode.WAIT)
            try:
                record = await self._approvals.request(
                    principal, None, trail.call_id, name, arguments_json, decision, channel="mcp"
                )
            except TooManyPendingApprovals as over:
                return _refused(over.message, "deny", "too_many_pending")
            trail.approval_id = record.id
            decided = await self._hold(record, decision, progress)
            if decided.status != APPROVED:
                reason = decided.decision_reason or decided.status
                text = f"The call to '{name}' was not approved ({decided.status}: {reason})."
                return _refused(text, str(decided.status), "not_approved")
            # Where a tool server finds the approval, to check it with `policies.verify_approval_token`.
            approval = {"id": decided.id, "token": decided.token}
            meta = cast(types.RequestParamsMeta, {APPROVAL_META_KEY: approval})
        assert isinstance(decision, Allow | NeedsApproval)
        return await self._forward(server, tool, arguments, meta, "approved" if meta else "allow")

    async def _hold(self, record: Approval, need: NeedsApproval, progress: ProgressReporter) -> Approval:
        """Wait for the decision, telling the client now and then that the call is still held."""
        wait = self._approvals.wait(record.tenant, record.id, need.timeout_s, self._poll_s)
        waiting = asyncio.ensure_future(wait)
        message = f"held for human approval (approval id {record.id})"
        try:
            await self._tell(progress, 0, message)
            ticks = 0
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=self._settings.progress_interval_s)
                if not waiting.done():
                    ticks += 1
                    await self._tell(progress, ticks, message)
            return waiting.result()
        finally:
            if not waiting.done():  # the client went away: stop polling, and let nobody approve it later
                waiting.cancel()
                await asyncio.shield(self._approvals.withdraw(record, "the agent went away before a decision"))

    async def _tell(self, progress: ProgressReporter, done: float, message: str) -> None:
        """A progress notification, given up on if the client does not take it in time: the hold
        itself stays bounded by the approval's wait, whatever the client reads."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._settings.progress_interval_s):
                await progress(done, message)

    async def _forward(
        self,
        server: UpstreamServer,
        tool: str,
        arguments: dict[str, Any],
        meta: types.RequestParamsMeta | None,
        decision: str,
    ) -> CallOutcome:
        try:
            result = await server.call(tool, arguments, meta)
        except UpstreamUnavailable as error:
            return _refused(str(error), decision, "upstream_unavailable")
        except UpstreamCallFailed as error:
            return _refused(str(error), decision, "upstream_error")
        size = len(result.model_dump_json(by_alias=True, exclude_none=True))
        if size > self._settings.max_result_bytes:
            limit = self._settings.max_result_bytes
            text = f"The result of '{tool}' is too large ({size} bytes; the limit is {limit})."
            return _refused(text, decision, "too_large")
        return CallOutcome(result, decision, "tool_error" if result.is_error else "ok")


def _encoded(arguments: dict[str, Any]) -> str | None:
    """The arguments as the policy, the approval and the audit digest see them; None when orjson
    cannot encode them. Arguments arrive as parsed JSON, so the one thing it refuses is an integer
    past 64 bits (it names no other cause a client could send)."""
    try:
        return orjson.dumps(arguments).decode()
    except orjson.JSONEncodeError:
        return None


def _refused(text: str, decision: str, status: str) -> CallOutcome:
    result = types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
    return CallOutcome(result, decision, status)
