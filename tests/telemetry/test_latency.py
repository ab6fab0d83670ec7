"""The in-process latency histograms read as OpenTelemetry's own histogram would: the SDK is the oracle."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from gateway.telemetry.latency import SCOPE, LatencyHistograms, PrometheusLatencies, WithLatencies
from gateway.telemetry.providers import TTFT

ATTRIBUTES = {"gen_ai.request.model": "m", "gateway.deployment": "a"}
# On the bounds exactly, between them, below the first, above the last, and zero.
VALUES = [0.0, 0.0005, 0.001, 0.0011, 0.04, 0.06, 0.0600001, 1.0, 59.9, 60.0, 61.0, 3600.0]


def sdk_histogram(values: Sequence[float]) -> tuple[HistogramDataPoint, MeterProvider]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    histogram = provider.get_meter(SCOPE).create_histogram(
        TTFT.name, unit=TTFT.unit, description=TTFT.description, explicit_bucket_boundaries_advisory=TTFT.bounds
    )
    for value in values:
        histogram.record(value, ATTRIBUTES)
    data = reader.get_metrics_data()
    assert data is not None
    (point,) = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert isinstance(point, HistogramDataPoint)
    return point, provider


def ours(values: Sequence[float]) -> LatencyHistograms:
    latencies = LatencyHistograms([TTFT])
    series = latencies.histograms[0].series(ATTRIBUTES)
    for value in values:
        series.record(value)
    return latencies


def test_buckets_count_sum_min_and_max_are_the_sdks() -> None:
    expected, provider = sdk_histogram(VALUES)
    (metric,) = ours(VALUES).metrics()
    (point,) = metric.data.data_points
    assert isinstance(point, HistogramDataPoint)
    assert list(point.bucket_counts) == list(expected.bucket_counts)
    assert list(point.explicit_bounds) == list(expected.explicit_bounds)
    assert (point.count, point.sum, point.min, point.max) == (expected.count, expected.sum, expected.min, expected.max)
    assert dict(point.attributes or {}) == ATTRIBUTES
    assert (metric.name, metric.unit, metric.description) == (TTFT.name, TTFT.unit, TTFT.description)
    assert isinstance(metric.data, Histogram)
    assert metric.data.aggregation_temporality is AggregationTemporality.CUMULATIVE
    provider.shutdown()


@pytest.mark.parametrize("value", [-0.001, math.inf, math.nan])
def test_values_the_sdk_drops_are_dropped(value: float) -> None:
    expected, provider = sdk_histogram([0.01, value])
    (metric,) = ours([0.01, value]).metrics()
    (point,) = metric.data.data_points
    assert isinstance(point, HistogramDataPoint)
    assert (point.count, point.sum) == (expected.count, expected.sum) == (1, 0.01)
    provider.shutdown()


def test_the_prometheus_text_is_what_the_sdks_prometheus_reader_writes() -> None:
    sdk_registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=sdk_registry, scope_info_enabled=False)
    provider = MeterProvider(metric_readers=[reader])
    histogram = provider.get_meter(SCOPE).create_histogram(
        TTFT.name, unit=TTFT.unit, description=TTFT.description, explicit_bucket_boundaries_advisory=TTFT.bounds
    )
    for value in VALUES:
        histogram.record(value, ATTRIBUTES)
    registry = CollectorRegistry()
    registry.register(PrometheusLatencies(ours(VALUES)))

    def lines(text: bytes) -> list[str]:
        return [line for line in text.decode().splitlines() if TTFT.prometheus_name in line]

    expected = lines(generate_latest(sdk_registry))
    assert len(expected) == len(TTFT.bounds) + 5  # HELP, TYPE, the buckets with +Inf, count, sum
    assert lines(generate_latest(registry)) == expected
    provider.shutdown()


def test_an_empty_histogram_is_not_exported() -> None:
    assert ours([]).metrics() == []
    registry = CollectorRegistry()
    registry.register(PrometheusLatencies(ours([])))
    assert "_bucket" not in generate_latest(registry).decode()


class Recording(MetricExporter):
    def __init__(self, temporality: AggregationTemporality) -> None:
        super().__init__(preferred_temporality={SdkHistogram: temporality})
        self.exported: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        return None


def test_the_otlp_export_carries_them_in_the_gateways_scope_beside_the_sdks_metrics() -> None:
    inner = Recording(AggregationTemporality.DELTA)
    wrapper = WithLatencies(inner, ours(VALUES), Resource.create({"service.name": "gw"}))
    preferred = wrapper._preferred_temporality  # what the reader reads
    assert preferred is not None
    assert preferred[SdkHistogram] is AggregationTemporality.DELTA
    reader = PeriodicExportingMetricReader(wrapper, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter(SCOPE).create_counter("gateway.things").add(2)
    provider.force_flush()
    provider.shutdown()

    (data, *_) = inner.exported
    (resource,) = data.resource_metrics
    (scope,) = resource.scope_metrics
    assert scope.scope.name == SCOPE
    assert [metric.name for metric in scope.metrics] == ["gateway.things", TTFT.name]
    (point,) = scope.metrics[1].data.data_points
    assert isinstance(point, HistogramDataPoint)
    assert point.count == len(VALUES)


def test_the_otlp_export_carries_them_when_the_sdk_has_nothing_to_send() -> None:
    inner = Recording(AggregationTemporality.CUMULATIVE)
    resource = Resource.create({"service.name": "gw"})
    exported = WithLatencies(inner, ours(VALUES), resource).with_latencies(MetricsData(resource_metrics=[]))
    (resource_metrics,) = exported.resource_metrics
    assert resource_metrics.resource is resource
    assert [m.name for s in resource_metrics.scope_metrics for m in s.metrics] == [TTFT.name]
