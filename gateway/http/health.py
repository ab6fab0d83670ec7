"""Liveness and readiness for orchestrators and load balancers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.audit.writer import AuditWriter
from gateway.errors import StoreUnavailable
from gateway.mcp.status import UpstreamStatus
from gateway.routing.router import Router
from gateway.store.base import LifecycleStore
from gateway.store_epoch import StoreEpoch
from gateway.wire import dumps


class HealthApi:
    def __init__(
        self,
        router: Router,
        store: LifecycleStore,
        audit: AuditWriter,
        epoch: StoreEpoch,
        tool_servers: Callable[[], Sequence[UpstreamStatus]] | None = None,
        release_problems: Mapping[str, list[str]] | None = None,
    ) -> None:
        self._router = router
        self._store = store
        self._audit = audit
        self._epoch = epoch
        self._tool_servers = tool_servers
        self._release_problems = release_problems if release_problems is not None else {}

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/healthz", self.alive, methods=["GET"]),
            Route("/readyz", self.ready, methods=["GET"]),
        ]

    async def alive(self, _: Request) -> Response:
        return Response(dumps({"status": "ok"}), media_type="application/json")

    async def ready(self, _: Request) -> Response:
        """Ready when every model has at least one healthy deployment whose breaker is not open
        and an active release (if any) whose checkpoint still verifies, the store answers, and audit
        records are getting through. A replica that cannot use the store is not ready under either
        quota mode (`fail_open` only decides what happens to the requests it still gets): an
        orchestrator should send traffic elsewhere or replace it."""
        models = {
            name: {
                "ready": group.ready,
                "deployments": {d.name: d.availability().value for d in group.deployments},
            }
            for name, group in self._router.groups.items()
        }
        for name, problems in self._release_problems.items():
            if problems and name in models:  # the active release's checkpoint no longer verifies
                models[name] = {**models[name], "ready": False, "release": problems}
        # A probe reads one key (one Redis Cluster slot): what live traffic met counts too.
        reachable = await self._store_up()
        failing = self._store.failing() if reachable else None
        store_up = reachable and failing is None
        audit_problem = self._audit.stuck_reason()
        wiped = self._epoch.wiped
        ready = all(m["ready"] for m in models.values()) and store_up and audit_problem is None and wiped is None
        body: dict[str, object] = {
            "status": "ready" if ready else "not_ready",
            "store": "wiped" if wiped else "down" if not reachable else "failing" if failing else "up",
            "audit": audit_problem or "ok",
            "models": models,
        }
        if wiped:
            body["store_error"] = wiped
        elif failing:
            body["store_error"] = failing
        if self._tool_servers is not None:
            # Reported, not gating: a replacement replica would meet the same MCP server down.
            body["mcp_servers"] = {s.name: s.state.value for s in self._tool_servers()}
        return Response(dumps(body), status_code=200 if ready else 503, media_type="application/json")

    async def _store_up(self) -> bool:
        try:
            await self._epoch.check()  # one round trip: reachable, and still the same store
        except StoreUnavailable:
            return False
        return True
