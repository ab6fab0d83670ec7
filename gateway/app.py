"""`create_app(settings)`: the whole service is assembled here and nowhere else.

Reading this file top to bottom gives the request path (the `stages` list), the HTTP surface
(the route lists) and what starts and stops with the process (the lifespan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.routing import Route

from checkpoints.registry import CheckpointRegistry
from gateway.approvals.service import ApprovalService
from gateway.approvals.tool_policy import CollectApproval, PolicyHolder, ToolPolicy
from gateway.audit.stage import AuditRequests, RefusalTally
from gateway.audit.writer import AuditWriter
from gateway.auth.api_keys import KeyService
from gateway.auth.stage import ActAs, Authenticate, Authenticator, ResolveModel
from gateway.auth.tenancy import ModelTenancy
from gateway.backends.factory import build_backend
from gateway.core.principal import Principal
from gateway.core.surface import Surfaces
from gateway.http.admin_api import build_admin_router
from gateway.http.admin_pages import admin_page_routes, openapi_routes
from gateway.http.approvals_api import build_approval_status_router, build_approvals_router
from gateway.http.candidate_app import CandidateApp
from gateway.http.chat_route import ChatCompletionsFirst
from gateway.http.errors import install_error_handlers
from gateway.http.health import HealthApi
from gateway.http.metrics_api import MetricsApi
from gateway.http.openai_api import OpenAIApi
from gateway.http.releases_api import build_releases_router
from gateway.http.requests import ParseRequest
from gateway.http.sessions_api import SessionsApi
from gateway.pipeline import Call, Handler, Meter, Stage, compose
from gateway.quota.admission import RetryDiscipline
from gateway.quota.stage import Admit
from gateway.releases.active import ActiveReleases
from gateway.releases.service import ReleaseService
from gateway.releases.stage import ApplyRelease, CanaryFallback
from gateway.releases.watchers import CheckpointWatch, ReleaseWatcher
from gateway.routing.breaker import BreakerState
from gateway.routing.deployment import Deployment
from gateway.routing.health import HealthMonitor
from gateway.routing.router import ModelGroup, Router
from gateway.routing.strategies import STRATEGIES
from gateway.sessions.manager import SessionManager
from gateway.sessions.stage import AppendHistory, AssignSession, ClaimSession
from gateway.settings import OpenApiExposure, Settings
from gateway.store.approval_record import PendingCaps
from gateway.store.base import Store
from gateway.store.factory import open_store
from gateway.store_epoch import StoreEpoch
from gateway.surfaces.chat_completions import ChatCompletions
from gateway.telemetry.providers import Telemetry, breaker_changed
from gateway.telemetry.stage import TraceRequests

if TYPE_CHECKING:
    from gateway.mcp.endpoint import McpEndpoint

log = logging.getLogger(__name__)


def build_router(
    settings: Settings,
    rng: random.Random | None = None,
    on_breaker_change: Callable[[str, BreakerState], None] | None = None,
) -> Router:
    groups = {}
    for model in settings.models:
        deployments = [
            Deployment(d, build_backend(d), settings.routing, on_breaker_change=on_breaker_change)
            for d in model.deployments
        ]
        order = STRATEGIES[model.strategy or settings.routing.strategy]
        groups[model.name] = ModelGroup(model.name, deployments, order, settings.routing)
    return Router(groups, settings.routing, rng=rng)


def build_audit_writer(settings: Settings, store: Store) -> AuditWriter:
    audit = settings.audit
    return AuditWriter(
        store,
        queue_size=audit.queue_size,
        batch_size=audit.batch_size,
        flush_interval_s=audit.flush_interval_s,
        hmac_key=audit.hmac_key.encode(),
        reserve_wait_s=audit.reserve_wait_s,
        stuck_after_s=audit.stuck_after_s,
        shutdown_wait_s=audit.shutdown_wait_s,
    )


def build_authenticator(settings: Settings, store: Store) -> Authenticator:
    return Authenticator(
        store,
        bootstrap_secret=settings.auth.admin_key or os.environ.get("GATEWAY_ADMIN_KEY", ""),
        cache_ttl_s=settings.auth.cache_ttl_s,
        stale_ttl_s=settings.auth.stale_ttl_s,
    )


def approval_secret(settings: Settings) -> bytes:
    if settings.tools.approval_secret:
        return settings.tools.approval_secret.encode()
    if settings.tools.policy_file is not None:  # no policy, no tools, no tokens: nothing to warn about
        log.warning("tools.approval_secret is not set: approval tokens verify only against this process")
    return secrets.token_bytes(32)


def build_mcp(
    settings: Settings,
    policies: PolicyHolder,
    approvals: ApprovalService,
    audit: AuditWriter,
    quota: Admit,
    authenticator: Authenticator,
) -> McpEndpoint | None:
    """The MCP endpoint, when upstream MCP servers are configured (the SDK is imported only then)."""
    if not settings.mcp.servers:
        return None
    from gateway.mcp.endpoint import McpEndpoint
    from gateway.mcp.service import McpGateway

    gateway = McpGateway(settings.mcp, policies, approvals, audit, quota, settings.tools.wait_poll_s)
    return McpEndpoint(gateway, authenticator, settings.server.max_body_bytes)


def create_app(settings: Settings, telemetry: Telemetry | None = None) -> FastAPI:
    """The whole service. Tests pass a `telemetry` with in-memory exporters; the lifespan shuts it down."""
    telemetry = telemetry or Telemetry(settings.telemetry)
    store = open_store(settings.store)
    router = build_router(settings, on_breaker_change=breaker_changed)
    deployments = [d for group in router.groups.values() for d in group.deployments]
    health = HealthMonitor(deployments, settings.routing.health)
    audit = build_audit_writer(settings, store)
    epoch = StoreEpoch(store, audit)
    authenticator = build_authenticator(settings, store)
    quota = Admit(store, settings.quota)
    model_names = [m.name for m in settings.models]
    refusals = RefusalTally(
        audit, interval_s=settings.audit.refusal_interval_s, max_sources=settings.audit.refusal_max_sources
    )
    tenancy = ModelTenancy({m.name: m.tenants for m in settings.models})
    keys = KeyService(store, audit, tenancy, on_change=authenticator.forget)
    audit_requests = AuditRequests(audit, capture=settings.audit.capture, refusals=refusals)
    policies = PolicyHolder(settings.tools.policy_file, audit)
    tools = settings.tools
    caps = PendingCaps(tools.max_pending_approvals_per_key, tools.max_pending_approvals_per_tenant)
    approvals = ApprovalService(store, audit, approval_secret(settings), caps=caps)
    telemetry.watch(router, quota)
    telemetry.watch_audit(audit)

    active_releases = ActiveReleases()
    checkpoint_registry = (
        CheckpointRegistry(settings.releases.checkpoint_registry) if settings.releases.checkpoint_registry else None
    )

    mcp = build_mcp(settings, policies, approvals, audit, quota, authenticator)
    if mcp is not None:
        telemetry.watch_tool_servers(mcp.gateway.statuses, lambda: mcp.gateway.calls)
    tool_policy = ToolPolicy(
        policies,
        approvals,
        audit,
        settings.tools.wait_poll_s,
        runs_at_gateway=mcp.gateway.executes if mcp else None,
        keepalive_s=settings.tools.wait_keepalive_s,
    )

    trace_requests = TraceRequests(telemetry, model_names)
    retry_discipline = RetryDiscipline(settings.quota.refuse_early_retries)
    assign_session = AssignSession(settings.sessions)
    parse_request = ParseRequest(settings.server.max_json_depth, settings.server.parse_in_thread_bytes)
    append_history = AppendHistory(store, settings.sessions.on_store_error)
    resolve_model = ResolveModel(tenancy)
    collect_approval = CollectApproval(approvals)

    def request_path(caller: Stage, admission: list[Stage]) -> list[Stage]:
        """The stages of a request, `caller` saying who calls and `admission` what it is charged.
        Every path shares the stage objects (a key told to wait is told so on each)."""
        return [
            trace_requests,  # outermost: refusals are traced and counted too
            audit_requests,  # refusals are recorded too
            caller,
            retry_discipline,  # a 429 anywhere below tells the key to wait
            assign_session,
            parse_request,
            append_history,
            resolve_model,
            apply_release,
            tool_policy,
            *admission,
            Meter(),
            collect_approval,  # X-Approval-Id: answered here, after admission, without a model
            CanaryFallback(),  # a canary request the candidate fails is served by the active release
        ]

    # The preflight's eval cases and smoke run take a client's path pinned to the candidate, run
    # as the promoting operator and charged to no tenant (called per preflight, once
    # `apply_release` below exists).
    def candidate_path(actor: Principal) -> Handler:
        return compose(request_path(ActAs(actor), []), Call(router))

    candidate = CandidateApp(candidate_path, authenticator, tenancy, settings.server)
    releases = ReleaseService(
        store,
        audit,
        router,
        health,
        checkpoint_registry,
        active_releases,
        candidate,
        on_canary_abort=telemetry.record_canary_abort,
    )
    release_watcher = ReleaseWatcher(
        store, releases, settings.releases.watch_interval_s, on_corrupt=telemetry.record_release_corrupt
    )
    checkpoint_watch = CheckpointWatch(active_releases, settings.releases.verify_interval_s)
    apply_release = ApplyRelease(active_releases, releases)
    stages = request_path(Authenticate(authenticator), [quota])
    # Taking over a dead replica's session: the caller is authenticated by the resume request; the
    # regenerated answer still passes the tool policy and is metered like any other.
    takeover = compose(
        [
            TraceRequests(telemetry, model_names, "session takeover"),
            audit_requests,
            tool_policy,
            quota,
            Meter(),
            CollectApproval(approvals),
        ],
        Call(router),
    )
    replica_id = f"replica-{uuid.uuid4().hex[:12]}"
    # The APIs clients speak: translators at the edge (gateway/core/surface.py).
    chat = ChatCompletions()
    surfaces = Surfaces([chat])
    sessions = (
        SessionManager(
            store, settings.sessions, replica_id, takeover, surfaces, on_checkpoint=telemetry.record_checkpoint
        )
        if settings.sessions.enabled
        else None
    )
    if sessions is not None:
        stages.append(ClaimSession(sessions))  # last: the lease exists before the first upstream byte
    pipeline = compose(stages, Call(router))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        audit.start()
        refusals.start()
        health.start()
        policy_watch = asyncio.get_running_loop().create_task(policies.watch(settings.tools.reload_interval_s))
        release_watch = asyncio.get_running_loop().create_task(release_watcher.run())
        verify_watch = asyncio.get_running_loop().create_task(checkpoint_watch.run())
        epoch_watch = asyncio.get_running_loop().create_task(epoch.run())
        if sessions is not None:
            sessions.start_checkpoints()
        try:
            async with mcp.running() if mcp is not None else contextlib.nullcontext():
                yield
        finally:
            policy_watch.cancel()
            release_watch.cancel()
            verify_watch.cancel()
            epoch_watch.cancel()
            await health.stop()
            if sessions is not None:
                await sessions.stop()
            await quota.drain()
            await refusals.stop()
            await audit.stop()
            for deployment in deployments:
                await deployment.backend.aclose()
            await store.aclose()
            await asyncio.to_thread(telemetry.shutdown)  # last: flushes the spans of everything above

    # FastAPI's own OpenTelemetry instrumentation stays off: the gateway's spans carry the GenAI
    # attributes, and a second set per request would only cost time.
    no_fastapi_telemetry: TelemetryConfig = {
        "tracing": False,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
    }
    # No docs pages; the schema maps every admin endpoint, so by default only an admin may read it.
    public_schema = settings.server.openapi is OpenApiExposure.PUBLIC
    app = FastAPI(
        title="agent-gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if public_schema else None,
        telemetry=no_fastapi_telemetry,
    )
    openai_api = OpenAIApi(pipeline, authenticator, sessions, tenancy, settings.server, chat)
    app.router.routes.extend(openai_api.routes())
    if sessions is not None:
        app.router.routes.extend(SessionsApi(sessions, authenticator).routes())
    mcp_statuses = mcp.gateway.statuses if mcp is not None else None
    health_api = HealthApi(router, store, audit, epoch, mcp_statuses, active_releases.checkpoint_problems)
    app.router.routes.extend(health_api.routes())
    app.router.routes.extend(MetricsApi(telemetry.registry).routes())
    app.include_router(build_admin_router(authenticator, keys, store, settings.audit.hmac_key.encode()))
    app.include_router(build_approvals_router(authenticator, approvals, policies))
    app.include_router(build_approval_status_router(authenticator, approvals))
    app.include_router(build_releases_router(authenticator, releases, tenancy, settings.releases.file_roots))
    app.router.routes.extend(admin_page_routes())
    if settings.server.openapi is OpenApiExposure.ADMIN:
        app.router.routes.extend(openapi_routes(app, authenticator))
    if mcp is not None:
        app.router.routes.append(Route(settings.mcp.path, mcp, methods=["GET", "POST", "DELETE"]))
    install_error_handlers(app)
    app.add_middleware(ChatCompletionsFirst, api=openai_api)
    app.state.router = router
    # The assembled path, for tests/security/test_stage_release.py to inject failures into.
    app.state.stages, app.state.openai_api, app.state.call = stages, openai_api, Call(router)
    app.state.audit = audit
    app.state.quota = quota
    app.state.telemetry = telemetry
    return app
