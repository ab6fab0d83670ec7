"""`gateway.requests` is counted in process and read at collection: exact, whoever collects."""

from __future__ import annotations

import threading

from opentelemetry.metrics import CallbackOptions
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint, Sum

from gateway.settings import TelemetrySettings
from gateway.telemetry.providers import RequestCounts, Telemetry


def test_each_label_set_is_its_own_series_counted_exactly() -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(TelemetrySettings(), metric_readers=[reader])
    for _ in range(3):
        telemetry.requests.add("chat.completions", "m", "a", 200)
    telemetry.requests.add("chat.completions", "m", "b", 200)
    telemetry.requests.add("chat.completions", "", "", 401)
    data = reader.get_metrics_data()
    assert data is not None
    (metric,) = [
        m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == "gateway.requests"
    ]
    assert isinstance(metric.data, Sum)
    assert metric.data.is_monotonic
    points = {}
    for point in metric.data.data_points:
        assert isinstance(point, NumberDataPoint)
        points[tuple(sorted((point.attributes or {}).items()))] = point.value
    assert points == {
        (
            ("gateway.deployment", "a"),
            ("gateway.surface", "chat.completions"),
            ("gen_ai.request.model", "m"),
            ("http.response.status_code", 200),
        ): 3,
        (
            ("gateway.deployment", "b"),
            ("gateway.surface", "chat.completions"),
            ("gen_ai.request.model", "m"),
            ("http.response.status_code", 200),
        ): 1,
        (
            ("gateway.deployment", ""),
            ("gateway.surface", "chat.completions"),
            ("gen_ai.request.model", ""),
            ("http.response.status_code", 401),
        ): 1,
    }
    telemetry.shutdown()


def test_a_collection_on_another_thread_while_requests_are_counted_loses_none() -> None:
    counts = RequestCounts()
    adding_done = threading.Event()
    collected: list[int] = []

    def collect() -> None:
        for _ in range(100_000):  # bounded; ends as soon as the counting does
            observed = counts.observe(CallbackOptions())
            collected.append(sum(int(o.value) for o in observed))
            if adding_done.is_set():
                return

    collector = threading.Thread(target=collect)
    collector.start()
    for n in range(50_000):
        counts.add("chat.completions", "m", f"d{n % 7}", 200 if n % 3 else 503)  # new label sets appear while it reads
    adding_done.set()
    collector.join(timeout=60)
    assert not collector.is_alive()
    assert collected == sorted(collected)  # a cumulative count never goes back
    assert sum(int(o.value) for o in counts.observe(CallbackOptions())) == 50_000
