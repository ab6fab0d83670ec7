"""`create_app(settings)`: the whole service is assembled here and nowhere else.

Reading this file top to bottom gives the request path (the `stages` list), the HTTP surface
(the route lists) and what starts and stops with the process (the lifespan).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator

from fastapi import FastAPI

from gateway.backends.factory import build_backend
from gateway.http.errors import install_error_handlers
from gateway.http.health import HealthApi
from gateway.http.openai_api import OpenAIApi
from gateway.pipeline import Call, Meter, ResolveModel, Stage, compose
from gateway.routing.deployment import Deployment
from gateway.routing.health import HealthMonitor
from gateway.routing.router import ModelGroup, Router
from gateway.routing.strategies import STRATEGIES
from gateway.settings import Settings


def build_router(settings: Settings, rng: random.Random | None = None) -> Router:
    groups = {}
    for model in settings.models:
        deployments = [Deployment(d, build_backend(d), settings.routing) for d in model.deployments]
        order = STRATEGIES[model.strategy or settings.routing.strategy]
        groups[model.name] = ModelGroup(model.name, deployments, order, settings.routing)
    return Router(groups, settings.routing, rng=rng)


def create_app(settings: Settings) -> FastAPI:
    router = build_router(settings)
    deployments = [d for group in router.groups.values() for d in group.deployments]
    health = HealthMonitor(deployments, settings.routing.health)
    model_names = [m.name for m in settings.models]

    stages: list[Stage] = [
        ResolveModel(model_names),
        Meter(),
    ]
    pipeline = compose(stages, Call(router))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        health.start()
        try:
            yield
        finally:
            await health.stop()
            for deployment in deployments:
                await deployment.backend.aclose()

    app = FastAPI(title="agent-gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.router.routes.extend(OpenAIApi(pipeline, model_names, settings.server.max_body_bytes).routes())
    app.router.routes.extend(HealthApi(router).routes())
    install_error_handlers(app)
    app.state.router = router
    app.state.health = health
    return app
