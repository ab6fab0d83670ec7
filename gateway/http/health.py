"""Liveness and readiness for orchestrators and load balancers."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.routing.router import Router
from gateway.wire import dumps


class HealthApi:
    def __init__(self, router: Router) -> None:
        self._router = router

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/healthz", self.alive, methods=["GET"]),
            Route("/readyz", self.ready, methods=["GET"]),
        ]

    async def alive(self, _: Request) -> Response:
        return Response(dumps({"status": "ok"}), media_type="application/json")

    async def ready(self, _: Request) -> Response:
        """Ready when every model has at least one healthy deployment whose breaker is not open."""
        models = {
            name: {
                "ready": group.ready,
                "deployments": {d.name: d.availability().value for d in group.deployments},
            }
            for name, group in self._router.groups.items()
        }
        ready = all(m["ready"] for m in models.values())
        body = {"status": "ready" if ready else "not_ready", "models": models}
        return Response(dumps(body), status_code=200 if ready else 503, media_type="application/json")
