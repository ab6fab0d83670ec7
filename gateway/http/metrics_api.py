"""`GET /metrics`: this app's metrics in the Prometheus text format.

No authentication, as is usual for a scrape endpoint: it carries counts and latencies by model,
deployment and status, never keys, tenants' data or content. Restrict it at the network if the
deployment names are sensitive.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route


class MetricsApi:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def routes(self) -> list[BaseRoute]:
        return [Route("/metrics", self.metrics, methods=["GET"])]

    async def metrics(self, _: Request) -> Response:
        return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)
