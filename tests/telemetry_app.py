"""An in-process gateway over scripted backends, with in-memory span and metric exporters."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.app import create_app
from gateway.auth.stage import new_secret
from gateway.backends.base import Backend
from gateway.settings import parse_settings
from gateway.telemetry.providers import Telemetry

PROMPT = "Tell me the launch codes hidden in the vault"
CHAT_BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 50}


@dataclass
class TracedGateway:
    http: httpx.AsyncClient
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    telemetry: Telemetry
    backends: Sequence[Backend]
    admin_key: str
    key: str = ""
    key_id: str = ""

    async def create_key(self, **fields: Any) -> tuple[str, str]:
        body = {"name": "test", "tenant": "acme", **fields}
        reply = await self.http.post("/admin/keys", json=body, headers=self.auth(self.admin_key))
        reply.raise_for_status()
        return reply.json()["key"]["id"], reply.json()["secret"]

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    async def chat(self, headers: dict[str, str] | None = None, key: str | None = None, **body: Any) -> httpx.Response:
        headers = {**self.auth(key), **(headers or {})}
        return await self.http.post("/v1/chat/completions", json={**CHAT_BODY, **body}, headers=headers)

    def server_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.kind is SpanKind.SERVER]

    def attempt_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.kind is SpanKind.CLIENT]

    def points(self, name: str) -> list[Any]:
        """The named metric's points, from the SDK's reader or (TTFT, TPOT) the in-process histograms."""
        data = self.metrics.get_metrics_data()
        assert data is not None
        metrics = [
            metric for resource in data.resource_metrics for scope in resource.scope_metrics for metric in scope.metrics
        ]
        metrics += self.telemetry.latencies.metrics()
        return [point for metric in metrics if metric.name == name for point in metric.data.data_points]

    def value(self, name: str, **attributes: Any) -> float:
        """The sum of a counter's or gauge's points whose attributes include `attributes`."""
        found = [p for p in self.points(name) if all(p.attributes.get(k) == v for k, v in attributes.items())]
        assert all(isinstance(p, NumberDataPoint) for p in found)
        total: float = sum(p.value for p in found)
        return total


def settings_for(tmp_path: Path, names: Sequence[str], admin_key: str, **sections: Any) -> dict[str, Any]:
    deployments = [
        {
            "name": name,
            "api_base": f"http://127.0.0.1:{9000 + i}/v1",
            "model": f"{name}-model",
            "priority": i,
            "continuation": "vllm",
        }
        for i, name in enumerate(names)
    ]
    routing = {"retry": {"backoff_base_s": 0.001}, "health": {"interval_s": 30}, **sections.pop("routing", {})}
    return {
        "store": {"kind": "embedded", "path": str(tmp_path / "data")},
        "auth": {"admin_key": admin_key},
        "routing": routing,
        "models": [{"name": "m", "deployments": deployments}],
        **sections,
    }


@contextlib.asynccontextmanager
async def traced_gateway(
    tmp_path: Path, *backends: Backend, tracing: bool = True, **sections: Any
) -> AsyncIterator[TracedGateway]:
    """The app with its lifespan running and one chat key of tenant "acme" (`gateway.key`)."""
    admin_key = new_secret()
    settings = parse_settings(settings_for(tmp_path, [b.name for b in backends], admin_key, **sections))
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    processors = [SimpleSpanProcessor(spans)] if tracing else []
    telemetry = Telemetry(settings.telemetry, span_processors=processors, metric_readers=[metrics])
    app = create_app(settings, telemetry)
    for deployment, backend in zip(app.state.router.groups["m"].deployments, backends, strict=True):
        await deployment.backend.aclose()
        deployment.backend = backend
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            gateway = TracedGateway(http, spans, metrics, telemetry, backends, admin_key)
            gateway.key_id, gateway.key = await gateway.create_key()
            yield gateway
