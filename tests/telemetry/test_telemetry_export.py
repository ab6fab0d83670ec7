"""OTLP/HTTP export, when `telemetry.otlp_endpoint` is set: spans and metrics reach the collector."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.doubles import Script, ScriptedBackend
from tests.telemetry_app import traced_gateway


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]]

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length", "0"))
        self.received.append((self.path, self.headers.get("content-type", ""), self.rfile.read(size)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    received: list[tuple[str, str, bytes]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


async def test_spans_and_metrics_are_exported_over_otlp_http(
    tmp_path: Path, collector: tuple[str, list[tuple[str, str, bytes]]]
) -> None:
    url, received = collector
    telemetry = {"otlp_endpoint": url, "otlp_timeout_s": 2}
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script()), tracing=False, telemetry=telemetry) as gateway:
        assert (await gateway.chat()).status_code == 200
    # Leaving the lifespan shut the providers down, which flushes both exporters.
    paths = {path for path, content_type, body in received if content_type == "application/x-protobuf" and body}
    assert paths == {"/v1/traces", "/v1/metrics"}
    exported = ExportMetricsServiceRequest()
    exported.ParseFromString(next(body for path, _, body in received if path == "/v1/metrics"))
    metrics = {
        metric.name: metric
        for resource in exported.resource_metrics
        for scope in resource.scope_metrics
        if scope.scope.name == "gateway"
        for metric in scope.metrics
    }
    assert "gateway.requests" in metrics  # the SDK's
    (ttft,) = metrics["gateway.upstream.time_to_first_token"].histogram.data_points  # kept in process
    assert ttft.count == 1
    assert {a.key: a.value.string_value for a in ttft.attributes} == {
        "gen_ai.request.model": "m",
        "gateway.deployment": "a",
    }
