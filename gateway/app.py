"""`create_app(settings)`: the whole service is assembled here and nowhere else.

Reading this file top to bottom gives the features (one builder each, gateway/assembly/), the
request path (the `request_path` list), the HTTP surface (the routes) and what starts and stops
with the process (each feature's `Part`, started in build order and stopped in reverse).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from gateway.assembly.access import build_access
from gateway.assembly.foundation import build_foundation
from gateway.assembly.lifecycle import Part, running
from gateway.assembly.releases import build_releases
from gateway.assembly.sessions import build_sessions
from gateway.assembly.tools import build_tools
from gateway.auth.stage import ActAs, Authenticator
from gateway.core.principal import Principal
from gateway.core.surface import Surfaces
from gateway.http.admin_pages import admin_page_routes, openapi_routes
from gateway.http.chat_route import ChatCompletionsFirst
from gateway.http.errors import install_error_handlers
from gateway.http.health import HealthApi
from gateway.http.messages_api import MessagesApi
from gateway.http.metrics_api import MetricsApi
from gateway.http.openai_api import OpenAIApi
from gateway.http.requests import ParseRequest
from gateway.http.responses_api import ResponsesApi
from gateway.pipeline import Call, Handler, Meter, Stage, compose
from gateway.settings import OpenApiExposure, Settings
from gateway.surfaces.chat_completions import ChatCompletions
from gateway.surfaces.embeddings import Embeddings
from gateway.surfaces.messages import Messages
from gateway.surfaces.responses import Responses
from gateway.telemetry.providers import Telemetry
from gateway.telemetry.stage import TraceRequests


def create_app(settings: Settings, telemetry: Telemetry | None = None) -> FastAPI:
    """The whole service. Tests pass a `telemetry` with in-memory exporters; the lifespan shuts it down."""
    base = build_foundation(settings, telemetry or Telemetry(settings.telemetry))
    access = build_access(settings, base)
    tools = build_tools(settings, base, access)
    parse_request = ParseRequest(settings.server.max_json_depth, settings.server.parse_in_thread_bytes)
    call = Call(base.router)

    def request_path(caller: Stage, admission: list[Stage]) -> list[Stage]:
        """The stages of a request, `caller` saying who calls and `admission` what it is charged.
        Every path shares the stage objects (a key told to wait is told so on each)."""
        return [
            access.trace_requests,  # outermost: refusals are traced and counted too
            access.audit_requests,  # refusals are recorded too
            caller,
            access.retry_discipline,  # a 429 anywhere below tells the key to wait
            sessions.assign_session,
            parse_request,
            sessions.append_history,
            access.resolve_model,
            releases.apply_release,
            tools.tool_policy,
            *admission,
            Meter(),
            tools.collect_approval,  # X-Approval-Id: answered here, after admission, without a model
            releases.canary_fallback,  # a canary request the candidate fails is served by the active release
        ]

    # The preflight's eval cases and smoke run take a client's path pinned to the candidate, run
    # as the promoting operator and charged to no tenant.
    def candidate_path(actor: Principal) -> Handler:
        return compose(request_path(ActAs(actor), []), call)

    releases = build_releases(settings, base, access, candidate_path)
    # Taking over a dead replica's session: the caller is authenticated by the resume request; the
    # regenerated answer still passes the tool policy and is metered like any other.
    takeover_stages: list[Stage] = [
        TraceRequests(base.telemetry, [m.name for m in settings.models], "session takeover"),
        access.audit_requests,
        tools.tool_policy,
        access.quota,
        Meter(),
        tools.collect_approval,
    ]
    # The APIs clients speak: translators at the edge (gateway/core/surface.py).
    chat, responses, messages, embeddings = ChatCompletions(), Responses(), Messages(), Embeddings()
    surfaces = Surfaces([chat, responses, messages, embeddings])
    sessions = build_sessions(settings, base, access, compose(takeover_stages, call), surfaces)
    stages = request_path(access.authenticate, [access.quota])
    if sessions.claim_session is not None:
        stages.append(sessions.claim_session)
    pipeline = compose(stages, call)
    openai_api = OpenAIApi(
        pipeline,
        access.authenticator,
        sessions.manager,
        access.tenancy,
        settings.server,
        chat,
        [responses, messages, embeddings],
    )
    health_api = HealthApi(
        base.router, base.store, base.audit, base.epoch, tools.tool_servers, releases.checkpoint_problems
    )
    kept = ResponsesApi(sessions.manager, access.authenticator).routes() if sessions.manager is not None else []
    counting = MessagesApi(access.authenticator, settings.server).routes()
    serving = Part(
        routes=[
            *openai_api.routes(),
            *kept,
            *counting,
            *health_api.routes(),
            *MetricsApi(base.telemetry.registry).routes(),
        ]
    )
    parts = [serving, base.part, access.part, tools.part, releases.part, sessions.part]
    app = _app(settings, parts, access.authenticator)
    app.add_middleware(ChatCompletionsFirst, api=openai_api)
    app.state.router = base.router
    # The assembled path, for tests/security/test_stage_release.py to inject failures into.
    app.state.stages, app.state.openai_api, app.state.call = stages, openai_api, call
    app.state.audit = base.audit
    app.state.quota = access.quota
    app.state.telemetry = base.telemetry
    return app


def _app(settings: Settings, parts: list[Part], authenticator: Authenticator) -> FastAPI:
    """The FastAPI app serving `parts`: their routes, and their work for the app's lifetime
    (the admin pages and, if so configured, the schema for admins too)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with running(parts):
            yield

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
    for part in parts:
        app.router.routes.extend(part.routes)
        for router in part.routers:
            app.include_router(router)
    app.router.routes.extend(admin_page_routes())
    if settings.server.openapi is OpenApiExposure.ADMIN:
        app.router.routes.extend(openapi_routes(app, authenticator))
    install_error_handlers(app)
    return app
