"""Traces and metrics: one tracer provider and one meter provider per app, built from settings.

Nothing here is global. `create_app` builds a `Telemetry` (a test passes one built with in-memory
exporters) and hands it to the stages and the router; the OpenTelemetry global providers are never
set, so two apps in one process never see each other's spans or metrics.

Metrics are read three ways: `GET /metrics` (Prometheus text from this app's own registry, never
the process-wide default one), OTLP/HTTP when `telemetry.otlp_endpoint` is set, and whatever
readers a test injects. Spans go to OTLP when configured and to injected processors; with nowhere
to send them none are built (see `Telemetry.tracer`).

Per request the hot path pays for two latency records (TTFT and TPOT, per attempt, kept in process:
`latency.py`) and one dict increment (`RequestCounts`); with an exporter, or a client's trace to
continue, also two spans and one context propagation. Nothing is recorded per chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NoOpTracer, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from prometheus_client import CollectorRegistry

from gateway.mcp.status import UpstreamState, UpstreamStatus
from gateway.routing.breaker import BreakerState
from gateway.settings import BackendKind, DeploymentSettings, TelemetrySettings
from gateway.telemetry.latency import (
    SCOPE,
    HistogramSpec,
    LatencyHistograms,
    LatencySeries,
    PrometheusLatencies,
    WithLatencies,
)

if TYPE_CHECKING:
    from gateway.audit.writer import AuditWriter
    from gateway.routing.router import Router

log = logging.getLogger("gateway.telemetry")  # its name as gateway/telemetry.py: operators filter by it

Attributes = dict[str, AttributeValue]


class QuotaCounters(Protocol):
    """What the quota stage (`quota.Admit`) counts. Named by shape: the router's request traces
    reach this module, and routing must not depend on the pipeline that `quota` is a stage of."""

    @property
    def fail_open_count(self) -> int: ...
    @property
    def settle_retry_count(self) -> int: ...
    @property
    def unsettled_count(self) -> int: ...


# Bucket boundaries in seconds. TTFT and TPOT start from the GenAI semantic conventions' advice
# and extend it at the ends: fast local models stream a token every few milliseconds, and
# reasoning models can think for a minute before their first token.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TTFT = HistogramSpec(
    "gateway.upstream.time_to_first_token",
    "gateway_upstream_time_to_first_token_seconds",
    "s",
    "time from sending an attempt upstream to its first output",
    TTFT_BUCKETS,
)
TPOT = HistogramSpec(
    "gateway.upstream.time_per_output_token",
    "gateway_upstream_time_per_output_token_seconds",
    "s",
    "time per output token after the first, per successful attempt",
    TPOT_BUCKETS,
)
CHECKPOINT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

BREAKER_VALUES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


class RequestCounts:
    """Chat completion requests by (model, deployment, status), counted in process and read by an
    observable counter when metrics are collected.

    Every request is counted, so this is the hottest metric: the SDK's synchronous counter spends
    ~9 us a measurement (attribute cleaning, hashing, locking), a dict increment a fraction of a
    microsecond. Exact all the same: only the event loop's thread adds; a collection on another
    thread (the OTLP exporter's) copies the dict in one C call, under the GIL. The labels are
    bounded (configured models and deployments, HTTP statuses), so the dict is too.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str, int], int] = {}

    def add(self, surface: str, model: str, deployment: str, status: int) -> None:
        key = (surface, model, deployment, status)
        self._counts[key] = self._counts.get(key, 0) + 1

    def observe(self, _: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(
                n,
                {
                    "gateway.surface": a,
                    "gen_ai.request.model": m,
                    "gateway.deployment": d,
                    "http.response.status_code": s,
                },
            )
            for (a, m, d, s), n in list(self._counts.items())
        ]


class DeploymentTelemetry(NamedTuple):
    """What an attempt on one deployment of one model reports to, computed once."""

    span_attributes: Attributes
    metric_attributes: Attributes
    ttft: LatencySeries
    tpot: LatencySeries


class Instruments:
    """The synchronous instruments; the observable ones are registered by `Telemetry.watch` (and
    `gateway.requests`, read from `RequestCounts`, when the telemetry is built). The latency
    histograms are not among them: see `latency.py`."""

    def __init__(self, meter: Meter) -> None:
        self.failures = meter.create_counter(
            "gateway.upstream.failures", unit="{attempt}", description="failed upstream attempts by reason"
        )
        self.quota_rejections = meter.create_counter(
            "gateway.quota.rejections", unit="{request}", description="requests refused by a quota, by limit"
        )
        self.approvals_pending = meter.create_up_down_counter(
            "gateway.approvals.pending",
            unit="{approval}",
            description="tool calls this replica holds while a person decides (wait mode)",
        )
        self.canary_aborted = meter.create_counter(
            "gateway.canary.aborted",
            unit="{canary}",
            description="canaries ended automatically because the candidate breached a threshold",
        )
        self.release_records_corrupt = meter.create_counter(
            "gateway.release.records_corrupt",
            unit="{record}",
            description="malformed release or canary records the release watcher found (the model kept its release)",
        )
        self.checkpoint_duration = meter.create_histogram(
            "gateway.session.checkpoint.duration",
            unit="s",
            description="time of one checkpoint write (every live session's news in one store call)",
            explicit_bucket_boundaries_advisory=CHECKPOINT_BUCKETS,
        )


class Telemetry:
    def __init__(
        self,
        settings: TelemetrySettings,
        *,
        span_processors: Sequence[SpanProcessor] = (),
        metric_readers: Sequence[MetricReader] = (),
    ) -> None:
        resource = Resource.create({"service.name": settings.service_name})
        processors, readers = list(span_processors), list(metric_readers)
        self.latencies = LatencyHistograms([TTFT, TPOT])
        if settings.otlp_endpoint is not None:
            processors.append(BatchSpanProcessor(_otlp_span_exporter(settings)))
            exporter = WithLatencies(_otlp_metric_exporter(settings), self.latencies, resource)
            readers.append(PeriodicExportingMetricReader(exporter))
        self.registry = CollectorRegistry()
        self.registry.register(PrometheusLatencies(self.latencies))
        # Scope labels would repeat otel_scope_name="gateway" on every series: they say nothing here.
        readers.append(PrometheusMetricReader(registry=self.registry, scope_info_enabled=False))
        # The providers are shut down by the app's lifespan, not by an atexit hook per instance.
        self.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in processors:
            self.tracer_provider.add_span_processor(processor)
        # With no processor every span would be built only to be dropped. The no-op tracer builds
        # none and returns the parent's context, so a client's traceparent still reaches the
        # upstream unchanged: the gateway is then invisible in the trace instead of a hole in it.
        self.tracer: Tracer = self.tracer_provider.get_tracer("gateway") if processors else NoOpTracer()
        self.records_spans = bool(processors)
        # Exemplars are not exported to Prometheus text and cost a context lookup per measurement.
        self.meter_provider = MeterProvider(
            metric_readers=readers,
            resource=resource,
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,
        )
        self._meter = self.meter_provider.get_meter(SCOPE)
        self.instruments = Instruments(self._meter)
        self.requests = RequestCounts()
        self._meter.create_observable_counter(
            "gateway.requests",
            [self.requests.observe],
            unit="{request}",
            description="model requests by surface, model, deployment, status",
        )
        self.propagator = TraceContextTextMapPropagator()
        self._deployments: dict[tuple[str, str], DeploymentTelemetry] = {}

    def deployment(self, model: str, deployment: DeploymentSettings) -> DeploymentTelemetry:
        """The attributes and latency series of one deployment of `model`, computed once."""
        key = (model, deployment.name)
        found = self._deployments.get(key)
        if found is None:
            span, metric = _deployment_attributes(model, deployment)
            ttft, tpot = (histogram.series(metric) for histogram in self.latencies.histograms)
            found = self._deployments[key] = DeploymentTelemetry(span, metric, ttft, tpot)
        return found

    def served_by(self, model: str, deployment: str) -> str | None:
        """The GenAI provider name of a deployment seen before, if any."""
        found = self._deployments.get((model, deployment))
        return str(found.span_attributes["gen_ai.provider.name"]) if found is not None else None

    def watch(self, router: Router, quota: QuotaCounters) -> None:
        """Register the gauges that read routing and quota state when metrics are collected."""
        deployments = [
            (d, self.deployment(g.name, d.settings).metric_attributes)
            for g in router.groups.values()
            for d in g.deployments
        ]

        def inflight(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(d.inflight, attributes) for d, attributes in deployments]

        def breaker(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(BREAKER_VALUES[d.breaker.state], attributes) for d, attributes in deployments]

        def fail_open(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(quota.fail_open_count)]

        self._meter.create_observable_gauge(
            "gateway.deployment.inflight", [inflight], unit="{request}", description="requests in flight per deployment"
        )
        self._meter.create_observable_gauge(
            "gateway.deployment.breaker_state",
            [breaker],
            unit="1",
            description="circuit breaker per deployment: 0 closed, 1 half-open, 2 open",
        )
        self._meter.create_observable_counter(
            "gateway.quota.fail_open",
            [fail_open],
            unit="{request}",
            description="requests let through unmetered because the quota store was unavailable",
        )
        self._meter.create_observable_counter(
            "gateway.quota.settle_retries",
            [lambda _: [Observation(quota.settle_retry_count)]],
            unit="{request}",
            description="quota settlements (lease releases) that waited for the store to come back",
        )
        self._meter.create_observable_counter(
            "gateway.quota.unsettled",
            [lambda _: [Observation(quota.unsettled_count)]],
            unit="{request}",
            description="quota settlements given up (the lease expired by itself; tokens stay estimated)",
        )

    def watch_audit(self, audit: AuditWriter) -> None:
        """Counters of what the audit writer could not do normally (never silent), and its backlog."""
        stats = audit.stats

        def counter(field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _: [Observation(getattr(stats, field))]

        descriptions = {
            "unencodable": "audit records that could not be encoded, replaced by an audit_error record",
            "lost": "audit records never written (the store stayed down through shutdown; each is logged)",
            "refused": "requests refused with 503 because the audit queue stayed full",
            "rolled_back": "appended audit records the store later no longer held (failover, restore, wipe)",
            "store_errors": "audit writes that failed because the store was unavailable (retried)",
            "errors": "audit writes interrupted by an unexpected error (retried)",
        }
        for field, description in descriptions.items():
            self._meter.create_observable_counter(
                f"gateway.audit.{field}", [counter(field)], unit="{record}", description=description
            )
        self._meter.create_observable_gauge(
            "gateway.audit.backlog",
            [lambda _: [Observation(audit.backlog)]],
            unit="{record}",
            description="audit records queued, not yet in the store",
        )

    def watch_tool_servers(
        self, statuses: Callable[[], Sequence[UpstreamStatus]], calls: Callable[[], Mapping[tuple[str, str], int]]
    ) -> None:
        """MCP upstream servers: whether each is up, and calls per server and outcome."""

        def up(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(int(s.state is UpstreamState.UP), {"server": s.name}) for s in statuses()]

        def counted(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {"server": server, "status": status}) for (server, status), n in calls().items()]

        self._meter.create_observable_gauge(
            "gateway.mcp.server_up", [up], unit="1", description="1 while the MCP server is connected"
        )
        self._meter.create_observable_counter(
            "gateway.mcp.calls", [counted], unit="{call}", description="MCP tool calls per server and outcome"
        )

    def record_canary_abort(self, model: str, version: str) -> None:
        self.instruments.canary_aborted.add(1, {"gen_ai.request.model": model, "version": version})

    def record_release_corrupt(self, model: str) -> None:
        self.instruments.release_records_corrupt.add(1, {"gen_ai.request.model": model})

    def record_checkpoint(self, seconds: float, sessions: int) -> None:
        # One store call writes every live session's news: `sessions` is not a label (unbounded).
        self.instruments.checkpoint_duration.record(seconds)

    def shutdown(self) -> None:
        """Flush and stop exporters; blocks up to the OTLP timeout, so call it off the event loop."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def breaker_changed(deployment: str, state: BreakerState) -> None:
    """A breaker changes inside the router's handling of an attempt's outcome, while the request's
    span is current (see `trace_stage`): the event goes on the request that tripped or closed it."""
    attributes: Attributes = {"gateway.deployment": deployment, "gateway.breaker.state": state.value}
    trace.get_current_span().add_event("gateway.breaker.changed", attributes)
    level = logging.WARNING if state is BreakerState.OPEN else logging.INFO
    log.log(level, "circuit breaker of %s is %s", deployment, state.value, extra={"deployment": deployment})


def _deployment_attributes(model: str, deployment: DeploymentSettings) -> tuple[Attributes, Attributes]:
    url = urlsplit(deployment.api_base)
    provider = _provider(deployment)
    span: Attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,  # the older name of the same attribute, still what many backends read
        "gen_ai.request.model": deployment.model,
        "server.address": url.hostname or "",
        "server.port": url.port or (443 if url.scheme == "https" else 80),
        "gateway.deployment": deployment.name,
    }
    return span, {"gen_ai.request.model": model, "gateway.deployment": deployment.name}


def _provider(deployment: DeploymentSettings) -> str:
    """The GenAI provider name: litellm names carry it as a prefix (`anthropic/claude-...`); every
    other deployment speaks OpenAI's protocol, which is what the `openai` value describes."""
    if deployment.kind is BackendKind.LITELLM:
        return deployment.model.split("/", 1)[0] if "/" in deployment.model else "litellm"
    return "openai"


def _otlp_span_exporter(settings: TelemetrySettings) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=f"{settings.otlp_endpoint}/v1/traces", timeout=settings.otlp_timeout_s)


def _otlp_metric_exporter(settings: TelemetrySettings) -> OTLPMetricExporter:
    return OTLPMetricExporter(endpoint=f"{settings.otlp_endpoint}/v1/metrics", timeout=settings.otlp_timeout_s)
