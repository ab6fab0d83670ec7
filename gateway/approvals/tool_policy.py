"""Tool policy in the request path: default deny, whitelist, argument rules, human approval.

Before the call: tools the key may not use are stripped (or the request refused), a tool_choice
naming one is a 403, and a `role: tool` message is accepted only if it answers a call this key
may make - approved, for a high-risk tool - so the result of a denied call cannot be smuggled
back to the model. After the call: every tool call the model returns arrives whole (the router
holds deltas until a call is complete) and is decided before anything of it reaches the client.
A denied call is replaced by a note saying what was blocked and why; a high-risk call waits for
a person (`wait`) or is parked (`defer`: the client asks again with `X-Approval-Id`). Either way the
response carries `X-Approval-Id` and `X-Approval-Status` from its first byte, and a waiting
non-streamed response is kept alive with whitespace before its JSON (see http/openai_api.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.approvals.service import APPROVED, PENDING, ApprovalService
from gateway.audit.writer import AuditWriter
from gateway.core.chunks import Chunk, ToolCallDelta
from gateway.core.principal import Principal
from gateway.errors import InvalidRequest, PermissionDenied, TooManyPendingApprovals
from gateway.pipeline import Handler, RequestContext
from gateway.store.approval_record import Approval
from policies import (
    Allow,
    ApprovalMode,
    Deny,
    InvalidApprovalToken,
    NeedsApproval,
    OnForbidden,
    Policy,
    PolicyEngine,
    PolicyError,
    PolicyFile,
    load_policy_file,
    verify_approval_token,
)

log = logging.getLogger("gateway.tool_policy")  # its name as gateway/tool_policy.py: operators filter by it
APPROVAL_HEADER = "x-approval-id"
TOOLS_REMOVED_HEADER = "X-Tools-Removed"


def _header_value(names: list[str]) -> str:
    """Tool names as one header value: a name is the client's text, so printable ASCII only."""
    shown = ["".join(c if " " <= c <= "~" else "?" for c in name[:64]) for name in names[:32]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


class PolicyHolder:
    """The policy file in force. A bad file is rejected whole and the previous one kept."""

    def __init__(self, path: Path | None, audit: AuditWriter | None = None) -> None:
        self._path = path
        self._audit = audit
        self.engine = PolicyEngine(PolicyFile())
        self.last_error: list[str] = []
        self._mtime = 0.0
        if path is not None:
            self.engine = PolicyEngine(load_policy_file(path))  # at startup a bad file is fatal
            self._mtime = path.stat().st_mtime

    def reload(self) -> list[str]:
        """Load the file again; the problems, if it was rejected (the old policy stays)."""
        if self._path is None:
            return []
        try:
            mtime = self._path.stat().st_mtime
            self.engine = PolicyEngine(load_policy_file(self._path))
        except PolicyError as error:
            self.last_error = list(error.problems)
            log.error("policy file rejected, keeping the previous one: %s", "; ".join(error.problems))
            return self.last_error
        except OSError as error:
            self.last_error = [f"{self._path}: {error.strerror or error}"]
            return self.last_error
        self._mtime, self.last_error = mtime, []
        return []

    async def reload_recorded(self, actor: str) -> list[str]:
        """`reload`, with an audit record of what happened (a rejected file too)."""
        problems = self.reload()
        if self._audit is not None and self._path is not None:
            await self._audit.submit(
                {
                    "kind": "admin",
                    "action": "policy.reload_rejected" if problems else "policy.reload",
                    "actor": actor,
                    "tenant": None,
                    "target": str(self._path),
                    "before": None,
                    "after": {"policies": sorted(self.engine.file.policies)},
                    "reason": "; ".join(problems),
                }
            )
        return problems

    async def watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(OSError):
                if self._path is not None and self._path.stat().st_mtime != self._mtime:
                    await self.reload_recorded("policy-file-watcher")


class ToolPolicy:
    """The pipeline stage."""

    def __init__(
        self,
        holder: PolicyHolder,
        approvals: ApprovalService,
        audit: AuditWriter,
        poll_s: float,
        runs_at_gateway: Callable[[str], bool] | None = None,
        keepalive_s: float = 15.0,
    ) -> None:
        self._holder = holder
        self._approvals = approvals
        self._audit = audit
        self._poll_s = poll_s
        self._keepalive_s = keepalive_s
        # Tools the gateway itself runs over MCP: their approval is asked for where they run, so a
        # high-risk call of one is released to the client here and held at execution instead.
        self._runs_at_gateway = runs_at_gateway or (lambda _: False)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        assert ctx.principal is not None
        engine = self._holder.engine
        policy = engine.policy_for(ctx.principal.tenant, ctx.principal.key_id)
        await self._check_request(ctx, engine, policy)
        if ctx.headers.get(APPROVAL_HEADER):
            # CollectApproval (innermost, after quota admission) answers; nothing reaches a model.
            async with contextlib.aclosing(call_next(ctx)) as answers:
                async for answer in answers:
                    yield answer
            return
        released = 0
        # Leading chunks without output wait for the first decision, so that the headers it sets
        # (X-Approval-Id) go out with the response's first byte, streamed or not.
        held: list[Chunk] = []
        started = False
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                if not started and not (chunk.carries_output or chunk.usage):
                    held.append(chunk)
                    continue
                if chunk.tool_calls:
                    calls = chunk.tool_calls
                    chunk.tool_calls = []
                    for call in calls:
                        verdict = await self._judge(ctx, engine, policy, call, chunk)
                        if isinstance(verdict, _Waiting):
                            if not started:  # the approval id and a first byte, before the wait
                                for early in held or [Chunk(role="assistant")]:
                                    yield early
                                held, started = [], True
                            verdict = await self._await(ctx, verdict, call, chunk)
                        if verdict:
                            # Clients merge deltas by index: each judged call gets its own, so two
                            # calls an upstream numbered alike never merge into one nobody judged.
                            call.index = released
                            released += 1
                if chunk.finish_reason == "tool_calls" and released == 0:
                    chunk.finish_reason = "stop"  # every call was withheld: the turn ends with the note
                for early in held:
                    yield early
                held, started = [], True
                yield chunk
        for early in held:
            yield early

    # --- before the call ------------------------------------------------------------------------
    async def _check_request(self, ctx: RequestContext, engine: PolicyEngine, policy: Policy | None) -> None:
        body = ctx.body
        if body.get("tools"):
            kept, removed = engine.filter_tools(policy, body["tools"])
            rejected = bool(removed) and policy is not None and policy.on_forbidden_tools is OnForbidden.REJECT
            for name in removed:
                decision, code = ("deny", "forbidden_tool") if rejected else ("strip", "not_allowed")
                await self._record(ctx, name, "", decision, code, "the key's policy does not allow this tool")
            if rejected:
                raise PermissionDenied(f"this key may not use the tools: {', '.join(removed)}")
            if removed:  # deny by default, but never silently
                ctx.response_headers[TOOLS_REMOVED_HEADER] = _header_value(removed)
                log.debug(
                    "tools removed from the request (%s): %s",
                    "no tool policy applies to this key" if policy is None else "not in its tool policy",
                    ", ".join(removed),
                    extra={"tools_removed": removed},
                )
            body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
            if kept:
                body["tools"] = kept
                if "tool_choice" in ctx.body:
                    body["tool_choice"] = ctx.body["tool_choice"]
        forced = engine.tool_choice_target(ctx.body.get("tool_choice"))
        if forced is not None and not engine.may_use(policy, forced):
            await self._record(ctx, forced, "", "deny", "tool_choice", "tool_choice names a tool the key may not use")
            raise PermissionDenied(f"tool_choice names '{forced}', which this key may not use")
        assert ctx.principal is not None
        self._check_tool_results(body.get("messages", []), engine, policy, ctx.principal)
        ctx.body = body

    def _check_tool_results(
        self, messages: list[dict[str, Any]], engine: PolicyEngine, policy: Policy | None, caller: Principal
    ) -> None:
        """Every tool result answers exactly one call in the conversation that this key may make.

        Call ids must be unique and answered at most once: otherwise a result could be filed
        under an allowed call while the model reads it as the answer to a forbidden one.
        (`role: "function"` results never get here: `ParseRequest` refuses the legacy API.)
        """
        calls: dict[Any, dict[str, Any]] = {}
        for index, message in enumerate(messages):
            for call in message.get("tool_calls") or () if message.get("role") == "assistant" else ():
                if call.get("id") in calls:
                    param = f"messages[{index}].tool_calls"
                    raise InvalidRequest(f"{param}: the tool call id '{call.get('id')}' is used twice", param=param)
                calls[call.get("id")] = call
        answered: set[Any] = set()
        for index, message in enumerate(messages):
            if message.get("role") != "tool":
                continue
            param = f"messages[{index}]"
            call = calls.get(message.get("tool_call_id"))
            if call is None:
                raise InvalidRequest(f"{param} answers a tool call that is not in the conversation", param=param)
            if call.get("id") in answered:
                raise InvalidRequest(f"{param} answers a tool call that was answered already", param=param)
            answered.add(call.get("id"))
            function = call.get("function") or {}
            # OpenAI sends "{}" for a call without arguments; some clients drop the field.
            name, arguments = str(function.get("name")), str(function.get("arguments") or "{}")
            decision = engine.decide(policy, name, arguments)
            if isinstance(decision, Deny):
                raise InvalidRequest(f"{param} is the result of '{name}', which this key may not use", param=param)
            if isinstance(decision, NeedsApproval) and not self._runs_at_gateway(name):
                self._check_approved(call, name, arguments, param, caller)

    def _check_approved(self, call: dict[str, Any], name: str, arguments: str, param: str, caller: Principal) -> None:
        token = call.get("approval_token")
        if not isinstance(token, str):
            raise InvalidRequest(f"{param} is the result of '{name}', which was never approved", param=param)
        try:
            # Only a token issued to this key vouches for its conversation (a token can be seen elsewhere).
            verify_approval_token(
                token, self._approvals.secret, name, arguments, key_id=caller.key_id, tenant=caller.tenant
            )
        except InvalidApprovalToken as error:
            raise InvalidRequest(
                f"{param}: the approval of '{name}' does not check out ({error})", param=param
            ) from None

    # --- after the call -------------------------------------------------------------------------
    async def _judge(
        self, ctx: RequestContext, engine: PolicyEngine, policy: Policy | None, call: ToolCallDelta, chunk: Chunk
    ) -> int | _Waiting:
        """Decide one complete call; put it back on `chunk` if released. Returns 1 if released, 0 if
        withheld, or the approval a person must decide first (wait mode)."""
        name, arguments = call.name or "", call.arguments
        decision = engine.decide(policy, name, arguments)
        if isinstance(decision, Allow) or (isinstance(decision, NeedsApproval) and self._runs_at_gateway(name)):
            chunk.tool_calls.append(call)
            reason = "" if isinstance(decision, Allow) else "approval is asked for when the gateway runs it (MCP)"
            await self._record(ctx, name, arguments, "allow", reason=reason)
            return 1
        if isinstance(decision, Deny):
            _note(chunk, f"The gateway blocked a call to '{name}': {decision.reason}")
            await self._record(ctx, name, arguments, "deny", decision.code, decision.reason)
            return 0
        assert isinstance(decision, NeedsApproval)
        assert ctx.principal is not None
        bindings = engine.file.bindings
        policy_name = bindings.keys.get(ctx.principal.key_id) or bindings.tenants.get(ctx.principal.tenant)
        try:
            record = await self._approvals.request(
                ctx.principal,
                ctx.session_id,
                call.id or "",
                name,
                arguments,
                decision,
                ctx.body.get("messages", []),
                policy_name,
            )
        except TooManyPendingApprovals as over:  # the request fails with it (429, or in band after output)
            await self._record(ctx, name, arguments, "approval_refused", over.code, over.message)
            raise
        await self._record(ctx, name, arguments, "approval_requested", approval_id=record.id)
        ctx.trace.approval_requested(record.id, name, decision.mode.value)
        ctx.response_headers["X-Approval-Id"] = record.id
        ctx.response_headers["X-Approval-Status"] = PENDING
        if decision.mode is ApprovalMode.DEFER:
            _note(
                chunk,
                f"The call to '{name}' awaits human approval (approval id {record.id}). "
                "Continue with the header X-Approval-Id once it is decided.",
            )
            return 0
        ctx.approval_keepalive_s = self._keepalive_s
        return _Waiting(record, decision)

    async def _await(self, ctx: RequestContext, waiting: _Waiting, call: ToolCallDelta, chunk: Chunk) -> int:
        record, name = waiting.record, call.name or ""
        pending = self._approvals.wait(record.tenant, record.id, waiting.decision.timeout_s, self._poll_s)
        decided = await ctx.trace.approval_wait(record.id, name, pending)
        return self._release_or_note(call, decided, chunk)

    def _release_or_note(self, call: ToolCallDelta, decided: Approval, chunk: Chunk) -> int:
        if decided.status == APPROVED:
            call.extra = {"approval_id": decided.id, "approval_token": decided.token}
            chunk.tool_calls.append(call)
            return 1
        reason = decided.decision_reason or decided.status
        _note(chunk, f"The call to '{call.name}' was not approved ({decided.status}: {reason}).")
        return 0

    async def _record(
        self,
        ctx: RequestContext,
        tool: str,
        arguments: str,
        decision: str,
        code: str = "",
        reason: str = "",
        approval_id: str | None = None,
    ) -> None:
        assert ctx.principal is not None
        await self._audit.submit(
            {
                "kind": "policy",
                "request_id": ctx.request_id,
                "tenant": ctx.principal.tenant,
                "key_id": ctx.principal.key_id,
                "session_id": ctx.session_id,
                "tool": tool,
                "decision": decision,
                "code": code,
                "reason": reason,
                "approval_id": approval_id,
                "arguments_sha256": _digest(arguments),
            }
        )


@dataclass(frozen=True, slots=True)
class _Waiting:
    record: Approval
    decision: NeedsApproval


class CollectApproval:
    """The innermost stage: a request with `X-Approval-Id` collects a deferred call - the call
    exactly as approved, or the rejection - instead of asking a model. It sits after quota
    admission, so collecting is metered like any request."""

    def __init__(self, approvals: ApprovalService) -> None:
        self._approvals = approvals

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        approval_id = ctx.headers.get(APPROVAL_HEADER)
        if not approval_id:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        assert ctx.principal is not None
        decided = await self._approvals.collect(ctx.principal, approval_id, ctx.body.get("messages", []))
        ctx.response_headers["X-Approval-Id"] = approval_id
        ctx.response_headers["X-Approval-Status"] = decided.status
        chunk = Chunk(role="assistant", finish_reason="tool_calls")
        if decided.status == PENDING:
            _note(chunk, f"Approval {approval_id} is still pending.")
            chunk.finish_reason = "stop"
            yield chunk
            return
        call = ToolCallDelta(0, decided.call_id or f"call_{approval_id}", decided.tool, decided.arguments)
        if decided.status == APPROVED:
            call.extra = {"approval_id": decided.id, "approval_token": decided.token}
            chunk.tool_calls.append(call)
        else:
            reason = decided.decision_reason or decided.status
            _note(chunk, f"The call to '{call.name}' was not approved ({decided.status}: {reason}).")
            chunk.finish_reason = "stop"
        yield chunk


def _note(chunk: Chunk, text: str) -> None:
    chunk.content = f"{chunk.content or ''}\n{text}".lstrip("\n")


def _digest(arguments: str) -> str:
    return hashlib.sha256(arguments.encode()).hexdigest()
