"""The upstream latency histograms (TTFT, TPOT): counted in process, exported as the SDK's would be.

Every upstream attempt records both, on the request path. OpenTelemetry's synchronous histogram
builds a Measurement, cleans, copies and hashes its attributes, looks up the current context and
takes a lock on each record: ~5 us warm in a loop, and on the request path, cold, 8% of a
non-streamed request's CPU at c=1 for the two records (py-spy): as much as parsing the request.
Here a deployment's series are bound once and a record is a bisect and four updates.

A reader sees what the SDK's explicit-bucket aggregation makes (bucket i counts the values in
(bounds[i-1], bounds[i]]), cumulative from the start of the process:
- Prometheus (`GET /metrics`): `PrometheusLatencies`, a collector on the registry the SDK's
  reader writes to, naming the series as that reader names the SDK's histograms;
- OTLP: `WithLatencies` wraps the metric exporter and adds them to every export under the
  gateway's instrumentation scope (cumulative, whatever temporality the exporter prefers);
- in process: `LatencyHistograms.metrics()`, what both of the above are made from.

Only the event loop's thread records. A collection on another thread (the OTLP exporter's)
copies a series' bucket counts in one C call and counts its values as their sum, so the buckets
and the count always agree; the sum can lack the one value being recorded at that instant.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import AttributeValue
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector

SCOPE = "gateway"  # the meter's name (`Telemetry`): the instrumentation scope of every gateway metric


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    name: str
    prometheus_name: str  # the OTel Prometheus exporter's name for it: dots as underscores, the unit's suffix
    unit: str
    description: str
    bounds: tuple[float, ...]


class LatencySeries:
    """One attribute set's histogram."""

    __slots__ = ("_bounds", "counts", "max", "min", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def record(self, value: float) -> None:
        if not 0.0 <= value < math.inf:  # as the SDK does: negative, infinite and NaN values are dropped
            return
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    attributes: dict[str, AttributeValue]
    counts: list[int]
    sum: float
    min: float
    max: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class LatencyHistogram:
    def __init__(self, spec: HistogramSpec) -> None:
        self.spec = spec
        self._series: dict[frozenset[tuple[str, AttributeValue]], tuple[dict[str, AttributeValue], LatencySeries]] = {}

    def series(self, attributes: Mapping[str, AttributeValue]) -> LatencySeries:
        """The series of one attribute set, made on first use; bind it once and keep it."""
        key = frozenset(attributes.items())
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = (dict(attributes), LatencySeries(self.spec.bounds))
        return found[1]

    def points(self) -> list[SeriesPoint]:
        """Each series recorded into, as it stands."""
        points = []
        for attributes, series in list(self._series.values()):
            counts = list(series.counts)
            if any(counts):
                points.append(SeriesPoint(attributes, counts, series.sum, series.min, series.max))
        return points


class LatencyHistograms:
    """The gateway's latency histograms, since `started_ns`."""

    def __init__(self, specs: Sequence[HistogramSpec]) -> None:
        self.started_ns = time.time_ns()
        self.histograms = [LatencyHistogram(spec) for spec in specs]

    def metrics(self) -> list[Metric]:
        now = time.time_ns()
        metrics = []
        for histogram in self.histograms:
            spec, points = histogram.spec, histogram.points()
            if not points:
                continue
            data_points = [
                HistogramDataPoint(
                    attributes=p.attributes,
                    start_time_unix_nano=self.started_ns,
                    time_unix_nano=now,
                    count=p.count,
                    sum=p.sum,
                    bucket_counts=p.counts,
                    explicit_bounds=spec.bounds,
                    min=p.min,
                    max=p.max,
                )
                for p in points
            ]
            data = Histogram(data_points=data_points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
            metrics.append(Metric(name=spec.name, description=spec.description, unit=spec.unit, data=data))
        return metrics


class PrometheusLatencies(Collector):
    """The histograms in the Prometheus registry, as the SDK's Prometheus reader would write them."""

    def __init__(self, latencies: LatencyHistograms) -> None:
        self._latencies = latencies

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for histogram in self._latencies.histograms:
            spec = histogram.spec
            points = histogram.points()
            labels = sorted({_label(key) for point in points for key in point.attributes})
            family = HistogramMetricFamily(spec.prometheus_name, spec.description, labels=labels)
            for point in points:
                values = {_label(k): str(v) for k, v in point.attributes.items()}
                cumulative, buckets = 0, []
                for bound, count in zip((*spec.bounds, math.inf), point.counts, strict=True):
                    cumulative += count
                    buckets.append((_le(bound), float(cumulative)))
                family.add_metric([values.get(label, "") for label in labels], buckets, point.sum)
            yield family


def _label(attribute: str) -> str:
    return attribute.replace(".", "_")


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(bound)


class WithLatencies(MetricExporter):
    """A metric exporter that sends the latency histograms along with the SDK's metrics."""

    def __init__(self, exporter: MetricExporter, latencies: LatencyHistograms, resource: Resource) -> None:
        # The reader reads what to ask the SDK for from its exporter: the wrapped one's preferences.
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._latencies = latencies
        self._resource = resource

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        return self._exporter.export(self.with_latencies(metrics_data), timeout_millis=timeout_millis, **kwargs)

    def with_latencies(self, metrics_data: MetricsData) -> MetricsData:
        latencies = self._latencies.metrics()
        if not latencies:
            return metrics_data
        resources = list(metrics_data.resource_metrics) or [ResourceMetrics(self._resource, [], "")]
        first = resources[0]
        scopes = list(first.scope_metrics)
        # Into the gateway's own scope, where the SDK's instruments of the same meter are.
        mine = next((i for i, s in enumerate(scopes) if s.scope.name == SCOPE), None)
        if mine is None:
            scopes.append(ScopeMetrics(scope=InstrumentationScope(SCOPE), metrics=latencies, schema_url=""))
        else:
            scopes[mine] = ScopeMetrics(
                scopes[mine].scope, [*scopes[mine].metrics, *latencies], scopes[mine].schema_url
            )
        resources[0] = ResourceMetrics(first.resource, scopes, first.schema_url)
        return MetricsData(resource_metrics=resources)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)
