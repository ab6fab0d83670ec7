"""Tool calls: the policy that allows, denies or holds them, the approval queue a held call waits
in, and the MCP endpoint that executes them at the gateway (when upstream servers are set)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.routing import BaseRoute, Route

from gateway.approvals.service import ApprovalService
from gateway.approvals.tool_policy import CollectApproval, PolicyHolder, ToolPolicy
from gateway.assembly.access import Access
from gateway.assembly.foundation import Foundation
from gateway.assembly.lifecycle import Part, Running, background
from gateway.http.approvals_api import build_approval_status_router, build_approvals_router
from gateway.mcp.status import UpstreamStatus
from gateway.settings import Settings
from gateway.store.approval_record import PendingCaps

if TYPE_CHECKING:
    from gateway.mcp.endpoint import McpEndpoint

log = logging.getLogger(__name__)


def approval_secret(settings: Settings) -> bytes:
    if settings.tools.approval_secret:
        return settings.tools.approval_secret.encode()
    if settings.tools.policy_file is not None:  # no policy, no tools, no tokens: nothing to warn about
        log.warning("tools.approval_secret is not set: approval tokens verify only against this process")
    return secrets.token_bytes(32)


def build_mcp(
    settings: Settings, policies: PolicyHolder, approvals: ApprovalService, base: Foundation, access: Access
) -> McpEndpoint | None:
    """The MCP endpoint, when upstream MCP servers are configured (the SDK is imported only then)."""
    if not settings.mcp.servers:
        return None
    from gateway.mcp.endpoint import McpEndpoint
    from gateway.mcp.service import McpGateway

    gateway = McpGateway(settings.mcp, policies, approvals, base.audit, access.quota, settings.tools.wait_poll_s)
    return McpEndpoint(gateway, access.authenticator, settings.server.max_body_bytes)


@dataclass(frozen=True, slots=True)
class Tools:
    approvals: ApprovalService
    tool_servers: Callable[[], Sequence[UpstreamStatus]] | None  # the MCP upstreams, for readiness
    tool_policy: ToolPolicy
    collect_approval: CollectApproval
    part: Part


def build_tools(settings: Settings, base: Foundation, access: Access) -> Tools:
    tools = settings.tools
    policies = PolicyHolder(tools.policy_file, base.audit)
    caps = PendingCaps(tools.max_pending_approvals_per_key, tools.max_pending_approvals_per_tenant)
    approvals = ApprovalService(base.store, base.audit, approval_secret(settings), caps=caps)
    mcp = build_mcp(settings, policies, approvals, base, access)
    tool_policy = ToolPolicy(
        policies,
        approvals,
        base.audit,
        tools.wait_poll_s,
        runs_at_gateway=mcp.gateway.executes if mcp else None,
        keepalive_s=tools.wait_keepalive_s,
    )
    routers = (
        build_approvals_router(access.authenticator, approvals, policies),
        build_approval_status_router(access.authenticator, approvals),
    )
    running: list[Running] = [background(lambda: policies.watch(tools.reload_interval_s), "tool-policy-watch")]
    routes: list[BaseRoute] = []
    if mcp is not None:
        base.telemetry.watch_tool_servers(mcp.gateway.statuses, lambda: mcp.gateway.calls)
        running.append(mcp.running)
        routes.append(Route(settings.mcp.path, mcp, methods=["GET", "POST", "DELETE"]))
    return Tools(
        approvals=approvals,
        tool_servers=mcp.gateway.statuses if mcp is not None else None,
        tool_policy=tool_policy,
        collect_approval=CollectApproval(approvals),
        part=Part(routes=routes, routers=routers, running=running),
    )
