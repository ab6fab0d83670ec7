"""Liveness and readiness for orchestrators and load balancers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.errors import StoreUnavailable
from gateway.mcp.status import UpstreamStatus
from gateway.routing.router import Router
from gateway.settings import FailMode
from gateway.store.base import Store
from gateway.wire import dumps


class HealthApi:
    def __init__(
        self,
        router: Router,
        store: Store,
        on_store_error: FailMode,
        tool_servers: Callable[[], Sequence[UpstreamStatus]] | None = None,
    ) -> None:
        self._router = router
        self._store = store
        self._store_required = on_store_error is FailMode.CLOSED
        self._tool_servers = tool_servers

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/healthz", self.alive, methods=["GET"]),
            Route("/readyz", self.ready, methods=["GET"]),
        ]

    async def alive(self, _: Request) -> Response:
        return Response(dumps({"status": "ok"}), media_type="application/json")

    async def ready(self, _: Request) -> Response:
        """Ready when every model has at least one healthy deployment whose breaker is not open,
        and the store answers. A store outage makes the replica not ready only under
        `fail_closed` quotas: under `fail_open` it still serves, and says the store is down."""
        models = {
            name: {
                "ready": group.ready,
                "deployments": {d.name: d.availability().value for d in group.deployments},
            }
            for name, group in self._router.groups.items()
        }
        store_up = await self._store_up()
        ready = all(m["ready"] for m in models.values()) and (store_up or not self._store_required)
        body: dict[str, object] = {
            "status": "ready" if ready else "not_ready",
            "store": "up" if store_up else "down",
            "models": models,
        }
        if self._tool_servers is not None:
            # Reported, not gating: a replacement replica would meet the same MCP server down.
            body["mcp_servers"] = {s.name: s.state.value for s in self._tool_servers()}
        return Response(dumps(body), status_code=200 if ready else 503, media_type="application/json")

    async def _store_up(self) -> bool:
        try:
            await self._store.ping()
        except StoreUnavailable:
            return False
        return True
