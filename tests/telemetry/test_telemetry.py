"""Spans and metrics of real requests through the in-process app, read from in-memory exporters."""

from __future__ import annotations

import asyncio
from pathlib import Path

from opentelemetry.sdk.metrics.export import HistogramDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from gateway.core.chunks import Chunk, ToolCallDelta
from gateway.errors import UpstreamConnectError, UpstreamProtocolError
from tests.doubles import Script, ScriptedBackend
from tests.telemetry_app import PROMPT, TracedGateway, traced_gateway

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"


def events(span: ReadableSpan, name: str) -> list[dict[str, object]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


def only(spans: list[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def assert_no_content(gateway: TracedGateway) -> None:
    for span in gateway.spans.get_finished_spans():
        assert PROMPT not in span.to_json()
        assert "Hello" not in span.to_json()  # the scripted completion
        assert gateway.key not in span.to_json()


async def test_a_request_has_a_server_span_with_one_attempt_span_and_is_counted(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script())) as gateway:
        reply = await gateway.chat()
        assert reply.status_code == 200
        server, attempt = only(gateway.server_spans()), only(gateway.attempt_spans())

        assert server.name == "POST /v1/chat/completions"
        assert server.status.status_code is StatusCode.UNSET
        assert server.attributes is not None
        assert {k: server.attributes.get(k) for k in ("gen_ai.operation.name", "gen_ai.request.model")} == {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "m",
        }
        assert server.attributes["gen_ai.response.model"] == "m"
        assert server.attributes["gen_ai.response.id"] == reply.json()["id"]
        assert server.attributes["gen_ai.response.finish_reasons"] == ("stop",)
        assert server.attributes["gen_ai.request.max_tokens"] == 50
        assert server.attributes["gen_ai.usage.input_tokens"] == 3
        assert server.attributes["gen_ai.usage.output_tokens"] == 2
        assert server.attributes["gen_ai.provider.name"] == server.attributes["gen_ai.system"] == "openai"
        assert server.attributes["gateway.deployment"] == "a"
        assert server.attributes["gateway.tenant"] == "acme"
        assert server.attributes["gateway.key_id"] == gateway.key_id
        assert server.attributes["gateway.session_id"] == reply.headers["X-Session-Id"]
        assert server.attributes["http.response.status_code"] == 200
        assert "gateway.release" not in server.attributes  # no releases yet: omitted, not null

        assert attempt.name == "chat a-model"
        assert attempt.parent is not None
        assert attempt.parent.span_id == server.context.span_id
        assert attempt.context.trace_id == server.context.trace_id
        assert attempt.attributes is not None
        assert dict(attempt.attributes) == {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "a-model",
            "gen_ai.request.max_tokens": 50,
            "gen_ai.response.model": "a-model",
            "gen_ai.response.finish_reasons": ("stop",),
            "gen_ai.usage.input_tokens": 3,
            "gen_ai.usage.output_tokens": 2,
            "server.address": "127.0.0.1",
            "server.port": 9000,
            "gateway.deployment": "a",
            "gateway.attempt": 1,
        }
        assert_no_content(gateway)

        assert gateway.value("gateway.requests", **{"gateway.deployment": "a", "http.response.status_code": 200}) == 1
        (ttft,) = gateway.points("gateway.upstream.time_to_first_token")
        assert isinstance(ttft, HistogramDataPoint)
        assert ttft.count == 1
        assert dict(ttft.attributes or {}) == {"gen_ai.request.model": "m", "gateway.deployment": "a"}
        assert gateway.value("gateway.deployment.inflight", **{"gateway.deployment": "a"}) == 0
        assert gateway.value("gateway.deployment.breaker_state", **{"gateway.deployment": "a"}) == 0


async def test_a_retry_before_the_first_token_shows_two_attempts_and_a_retry_event(tmp_path: Path) -> None:
    a = ScriptedBackend("a", Script(error=UpstreamConnectError("refused")))
    async with traced_gateway(tmp_path, a, ScriptedBackend("b", Script())) as gateway:
        assert (await gateway.chat()).status_code == 200
        server = only(gateway.server_spans())
        first, second = sorted(gateway.attempt_spans(), key=lambda s: s.start_time or 0)

        assert first.status.status_code is StatusCode.ERROR
        assert first.attributes is not None
        assert second.attributes is not None
        assert first.attributes["gateway.failure_reason"] == "connect_error"
        assert first.attributes["error.type"] == "upstream_connect_error"
        assert (first.attributes["gateway.attempt"], second.attributes["gateway.attempt"]) == (1, 2)
        assert second.status.status_code is StatusCode.UNSET
        assert second.attributes["gateway.deployment"] == "b"
        assert events(server, "gateway.retry") == [
            {"gateway.deployment": "b", "gateway.failure_reason": "connect_error", "gateway.attempt": 2}
        ]
        assert server.attributes is not None
        assert server.attributes["gateway.attempts"] == 2
        failures = {"gateway.deployment": "a", "gateway.failure_reason": "connect_error"}
        assert gateway.value("gateway.upstream.failures", **failures) == 1


async def test_a_midstream_failover_shows_two_attempts_and_a_failover_event(tmp_path: Path) -> None:
    a = ScriptedBackend("a", Script(tokens=["one", " two", " three"], error=UpstreamProtocolError("cut"), fail_after=1))
    b = ScriptedBackend("b", Script(tokens=[" two", " three"]))
    async with traced_gateway(tmp_path, a, b) as gateway:
        reply = await gateway.chat(stream=True)
        assert reply.status_code == 200
        assert "[DONE]" in reply.text
        server = only(gateway.server_spans())
        first, second = sorted(gateway.attempt_spans(), key=lambda s: s.start_time or 0)

        assert first.status.status_code is StatusCode.ERROR
        assert first.attributes is not None
        assert first.attributes["gateway.failure_reason"] == "protocol_error"
        assert second.attributes is not None
        assert second.attributes["gateway.deployment"] == "b"
        assert events(server, "gateway.failover") == [
            {
                "gateway.deployment": "a",
                "gateway.failure_reason": "protocol_error",
                "gateway.output_chunks": 1,
                "gateway.failovers": 1,
            }
        ]
        assert server.status.status_code is StatusCode.UNSET
        assert server.attributes is not None
        assert server.attributes["gateway.failovers"] == 1
        # TTFT is recorded once per attempt that produced output: both did, one series each.
        ttft = gateway.points("gateway.upstream.time_to_first_token")
        assert sorted((p.attributes["gateway.deployment"], p.count) for p in ttft) == [("a", 1), ("b", 1)]


async def test_a_quota_rejection_is_an_error_span_an_event_and_a_count(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script())) as gateway:
        _, limited = await gateway.create_key(rpm=1)
        assert (await gateway.chat(key=limited)).status_code == 200
        refused = await gateway.chat(key=limited)
        assert refused.status_code == 429
        server = gateway.server_spans()[-1]

        assert server.status.status_code is StatusCode.ERROR
        assert server.attributes is not None
        assert server.attributes["http.response.status_code"] == 429
        assert server.attributes["error.type"] == "rate_limit_exceeded"
        (event,) = events(server, "gateway.quota.rejected")
        assert (event["gateway.quota.limit"], event["gateway.quota.scope"]) == ("rpm", "key")
        assert gateway.value("gateway.quota.rejections", **{"gateway.quota.limit": "rpm"}) == 1
        assert gateway.value("gateway.requests", **{"http.response.status_code": 429}) == 1
        assert not [s for s in gateway.attempt_spans() if s.parent and s.parent.span_id == server.context.span_id]


async def test_the_clients_trace_context_is_continued_and_passed_to_the_upstream(tmp_path: Path) -> None:
    a = ScriptedBackend("a", Script())
    async with traced_gateway(tmp_path, a) as gateway:
        headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01", "tracestate": "vendor=opaque"}
        assert (await gateway.chat(headers=headers)).status_code == 200
        server, attempt = only(gateway.server_spans()), only(gateway.attempt_spans())

        assert f"{server.context.trace_id:032x}" == TRACE_ID
        assert server.parent is not None
        assert f"{server.parent.span_id:016x}" == CLIENT_SPAN_ID
        assert server.parent.is_remote
        sent = a.requests[0].headers
        assert sent["traceparent"] == f"00-{TRACE_ID}-{attempt.context.span_id:016x}-01"
        assert sent["tracestate"] == "vendor=opaque"


async def test_every_attempt_carries_its_own_span_as_the_upstreams_parent(tmp_path: Path) -> None:
    a = ScriptedBackend("a", Script(error=UpstreamConnectError("refused")))
    b = ScriptedBackend("b", Script())
    async with traced_gateway(tmp_path, a, b) as gateway:
        assert (await gateway.chat()).status_code == 200
        by_deployment = {str((s.attributes or {})["gateway.deployment"]): s for s in gateway.attempt_spans()}
        for backend in (a, b):
            span_id = by_deployment[backend.name].context.span_id
            assert backend.requests[0].headers["traceparent"].split("-")[2] == f"{span_id:016x}"


async def test_without_a_span_exporter_no_spans_are_built_and_the_clients_context_passes_through(
    tmp_path: Path,
) -> None:
    a = ScriptedBackend("a", Script())
    async with traced_gateway(tmp_path, a, tracing=False) as gateway:
        traceparent = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"
        assert (await gateway.chat(headers={"traceparent": traceparent})).status_code == 200
        assert (await gateway.chat()).status_code == 200
        assert a.requests[0].headers["traceparent"] == traceparent
        assert "traceparent" not in a.requests[1].headers
        assert gateway.value("gateway.requests", **{"http.response.status_code": 200}) == 2
        (ttft,) = gateway.points("gateway.upstream.time_to_first_token")
        assert ttft.count == 2, "a request without a trace records its attempt's latency all the same"


async def test_a_breaker_that_opens_is_an_event_and_a_gauge(tmp_path: Path) -> None:
    a = ScriptedBackend("a", Script(error=UpstreamConnectError("refused")))
    routing = {"breaker": {"failure_threshold": 1, "cooldown_s": 60}}
    async with traced_gateway(tmp_path, a, ScriptedBackend("b", Script()), routing=routing) as gateway:
        assert (await gateway.chat()).status_code == 200
        server = only(gateway.server_spans())
        assert events(server, "gateway.breaker.changed") == [
            {"gateway.deployment": "a", "gateway.breaker.state": "open"}
        ]
        assert gateway.value("gateway.deployment.breaker_state", **{"gateway.deployment": "a"}) == 2
        assert gateway.value("gateway.deployment.breaker_state", **{"gateway.deployment": "b"}) == 0


async def test_checkpoint_writes_are_timed(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script())) as gateway:
        assert (await gateway.chat(stream=True)).status_code == 200
        for _ in range(100):  # the checkpointer runs every 0.1 s: bounded wait for its first write
            if gateway.points("gateway.session.checkpoint.duration"):
                break
            await asyncio.sleep(0.02)
        (written,) = gateway.points("gateway.session.checkpoint.duration")
        assert isinstance(written, HistogramDataPoint)
        assert written.count >= 1


async def test_fail_open_admissions_are_counted(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script())) as gateway:
        assert gateway.value("gateway.quota.fail_open") == 0
        quota = gateway.http._transport.app.state.quota  # type: ignore[attr-defined]
        quota.fail_open_count += 3
        assert gateway.value("gateway.quota.fail_open") == 3


async def test_metrics_endpoint_serves_prometheus_text_without_a_key(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script())) as gateway:
        assert (await gateway.chat()).status_code == 200
        reply = await gateway.http.get("/metrics")
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/plain")
        lines = reply.text.splitlines()
        counted = [line for line in lines if line.startswith("gateway_requests_total{")]
        labels = (
            'gateway_deployment="a",gateway_surface="chat.completions",gen_ai_request_model="m",'
            'http_response_status_code="200"'
        )
        assert counted == [f"gateway_requests_total{{{labels}}} 1.0"]
        assert any(line.startswith("gateway_upstream_time_to_first_token_seconds_bucket{") for line in lines)
        assert any(line.startswith('gateway_deployment_breaker_state{gateway_deployment="a"') for line in lines)
        assert PROMPT not in reply.text


APPROVAL_POLICY = """
policies:
  agent:
    approval: {mode: wait, timeout_s: 10, ttl_s: 60}
    tools:
      - {name: refund_payment, risk: high}
bindings:
  tenants: {acme: agent}
"""
REFUND_TOOL = {"type": "function", "function": {"name": "refund_payment", "parameters": {"type": "object"}}}


async def test_an_approval_wait_is_pending_meanwhile_and_shows_as_events(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(APPROVAL_POLICY)
    backend = ScriptedBackend("a", Script(tokens=[]))
    backend.prelude = [Chunk(tool_calls=[ToolCallDelta(0, "call_1", "refund_payment", '{"amount": 5}')])]
    tools = {"policy_file": str(tmp_path / "policy.yaml"), "wait_poll_s": 0.01}
    async with traced_gateway(tmp_path, backend, tools=tools) as gateway:
        answer = asyncio.create_task(gateway.chat(tools=[REFUND_TOOL]))
        admin = gateway.auth(gateway.admin_key)
        # Bounded wait for the held call to be recorded and its wait to begin: the approval is
        # listed a few awaits before the request starts waiting (and counts itself pending), so
        # on a loaded machine the gauge can still read 0 just after the listing shows it.
        for _ in range(500):
            pending = (await gateway.http.get("/admin/approvals", headers=admin)).json()["data"]
            if pending and gateway.value("gateway.approvals.pending") == 1:
                break
            await asyncio.sleep(0.01)
        assert gateway.value("gateway.approvals.pending") == 1
        (approval,) = pending
        decided = await gateway.http.post(f"/admin/approvals/{approval['id']}/approve", headers=admin)
        assert decided.status_code == 200
        assert (await answer).status_code == 200
        assert gateway.value("gateway.approvals.pending") == 0

        server = only(gateway.server_spans())
        held = {"gateway.approval_id": approval["id"], "gen_ai.tool.name": "refund_payment"}
        assert events(server, "gateway.approval.requested") == [{**held, "gateway.approval_mode": "wait"}]
        assert events(server, "gateway.approval.wait") == [held]
        (decision,) = events(server, "gateway.approval.decided")
        assert decision["gateway.approval_status"] == "approved"
        assert '"amount"' not in server.to_json()  # tool arguments are content too
