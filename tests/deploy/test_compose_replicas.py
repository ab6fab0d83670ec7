"""The compose stack without containers: two gateway processes on one Redis, wired exactly as
deploy/compose.yaml wires them (its gateway config, only the host names moved to 127.0.0.1), share
keys, quotas and sessions, and export traces to the collector address."""

from __future__ import annotations

import gzip
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from common.processes import Announced
from common.sse_reader import read_events
from gateway.auth.stage import new_secret
from testkit.procs import GatewayProcess, delete_redis_prefix, gateway_process, shared_redis_url, start_sim
from tests.deploy.files import COMPOSE_GATEWAY_CONFIG, compose_services

BODY: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "shared?"}], "max_tokens": 4}
STREAM: dict[str, Any] = {**BODY, "max_tokens": 12, "stream": True}


@dataclass
class CollectorStandIn:
    """Accepts OTLP/HTTP posts on 127.0.0.1 in place of the otel-collector service."""

    server: ThreadingHTTPServer
    posts: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.server.server_port}"

    def trace_service_names(self) -> set[str]:
        names = set()
        for path, body in list(self.posts):
            if path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                for spans in request.resource_spans:
                    names |= {a.value.string_value for a in spans.resource.attributes if a.key == "service.name"}
        return names


def start_collector() -> CollectorStandIn:
    posts: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            posts.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return CollectorStandIn(server, posts)


def rewrite_hosts(node: Any, hosts: dict[str, str]) -> Any:
    """`node` with every `//service:port` of a compose service replaced by where the test runs it."""
    if isinstance(node, dict):
        return {key: rewrite_hosts(value, hosts) for key, value in node.items()}
    if isinstance(node, list):
        return [rewrite_hosts(value, hosts) for value in node]
    if isinstance(node, str):
        for service, local in hosts.items():
            node = node.replace(f"//{service}", f"//{local}")
    return node


def urls_in(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [url for value in node.values() for url in urls_in(value)]
    if isinstance(node, list):
        return [url for value in node for url in urls_in(value)]
    return [node] if isinstance(node, str) and "://" in node else []


def compose_config_on_loopback(sims: dict[str, Announced], collector: CollectorStandIn, prefix: str) -> dict[str, Any]:
    """deploy/compose/gateway.yaml with the compose services' host names moved to 127.0.0.1."""
    services = compose_services()
    # redis:6379 is the session's own Redis (a free port), as the collector and the sims are.
    hosts = {"redis:6379": urlsplit(shared_redis_url()).netloc, "otel-collector:4318": collector.netloc}
    for name, sim in sims.items():
        command = services[name]["command"]
        hosts[f"{name}:{command[command.index('--port') + 1]}"] = urlsplit(sim.url).netloc
    config = rewrite_hosts(yaml.safe_load(COMPOSE_GATEWAY_CONFIG.read_text(encoding="utf-8")), hosts)
    leftover = [url for url in urls_in(config) if urlsplit(url).hostname != "127.0.0.1"]
    assert not leftover, f"hosts the compose stack has but this test does not run: {leftover}"
    config["server"]["host"] = "127.0.0.1"  # the container's 0.0.0.0
    config["store"]["key_prefix"] = prefix  # this test's own keys in the session's Redis
    return dict(config)


@dataclass
class Stack:
    first: GatewayProcess
    second: GatewayProcess
    collector: CollectorStandIn


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    collector = start_collector()
    # What compose passes both replicas (deploy/.env), and a short span batch delay for the test.
    env = {"GATEWAY_APPROVAL_SECRET": new_secret(), "OTEL_BSP_SCHEDULE_DELAY": "100"}
    admin_key = new_secret()
    tmp_path = tmp_path_factory.mktemp("compose")
    try:
        with ExitStack() as processes:
            sims = {}
            for name in ("sim-1", "sim-2"):
                sims[name] = start_sim()
                processes.callback(sims[name].stop)
            config = compose_config_on_loopback(sims, collector, prefix)
            first = processes.enter_context(gateway_process(tmp_path, config, env=env, admin_key=admin_key))
            second = processes.enter_context(gateway_process(tmp_path, config, env=env, admin_key=admin_key))
            yield Stack(first, second, collector)
    finally:
        collector.server.shutdown()
        collector.server.server_close()
        delete_redis_prefix(prefix)


def chat(gateway: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(key), timeout=10)


def sse_events(text: str) -> list[tuple[int, Any]]:
    return [
        (int(seq or 0), "[DONE]" if data == b"[DONE]" else orjson.loads(data)) for data, _, seq in read_events(text)
    ]


def test_both_replicas_are_ready_on_the_compose_backends_and_store(stack: Stack) -> None:
    for gateway in (stack.first, stack.second):
        ready = httpx.get(f"{gateway.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json()["store"] == "up"
        assert set(ready.json()["models"]["sim-model"]["deployments"]) == {"sim-a", "sim-b"}


def test_a_key_created_through_one_replica_works_on_the_other(stack: Stack) -> None:
    _, created_on_first = stack.first.create_key()
    _, created_on_second = stack.second.create_key()
    assert chat(stack.second, created_on_first).status_code == 200
    assert chat(stack.first, created_on_second).status_code == 200


def test_a_quota_is_counted_once_across_both_replicas(stack: Stack) -> None:
    _, key = stack.first.create_key(rpm=4)
    statuses = [chat((stack.first, stack.second)[i % 2], key).status_code for i in range(8)]
    assert statuses == [200] * 4 + [429] * 4


def test_a_stream_started_on_one_replica_replays_identically_on_the_other(stack: Stack) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    headers = {**stack.first.headers(), "X-Session-Id": session_id}
    streamed = httpx.post(f"{stack.first.url}/v1/chat/completions", json=STREAM, headers=headers, timeout=20)
    assert streamed.status_code == 200
    events = sse_events(streamed.text)
    assert events[-1] == (len(events), "[DONE]")

    replayed = httpx.get(
        f"{stack.second.url}/v1/sessions/{session_id}/stream",
        headers={**stack.second.headers(stack.first.key), "Last-Event-ID": "0"},
        timeout=20,
    )
    assert replayed.status_code == 200, replayed.text
    assert sse_events(replayed.text) == events


def test_replicas_export_traces_to_the_collector_address(stack: Stack) -> None:
    assert chat(stack.second, stack.second.key).status_code == 200
    # Spans are batched every 100 ms (OTEL_BSP_SCHEDULE_DELAY): bounded polling for the export.
    for _ in range(100):
        if "agent-gateway" in stack.collector.trace_service_names():
            break
        time.sleep(0.1)
    assert stack.collector.trace_service_names() == {"agent-gateway"}


def test_a_release_switched_on_one_replica_is_served_by_the_other(stack: Stack) -> None:
    admin: dict[str, Any] = {"headers": stack.first.headers(stack.first.admin_key), "timeout": 30}
    base = f"{stack.first.url}/admin/models/sim-model"
    for version, deployment in (("r1", "sim-a"), ("r2", "sim-b")):
        body = {"version": version, "deployments": [deployment], "system_prompt": f"release {version}"}
        assert httpx.post(f"{base}/releases", json=body, **admin).status_code == 201
        assert httpx.post(f"{base}/promote", json={"version": version}, **admin).status_code == 200
    assert httpx.post(f"{base}/rollback", json={"reason": "test"}, **admin).json()["active"] == "r1"
    second = f"{stack.second.url}/admin/models/sim-model/releases"
    deadline = time.monotonic() + 2
    while True:  # the switch reaches the other replica within its watch interval
        audit = httpx.get(
            f"{stack.second.url}/admin/audit", params={"kind": "request", "limit": 1000}, headers=admin["headers"]
        )
        chat(stack.second, stack.first.key).raise_for_status()
        served = [r["release"] for r in audit.json()["data"]]
        if served and served[-1] == "r1":
            break
        assert time.monotonic() < deadline, served[-5:]
    assert httpx.get(second, headers=admin["headers"], timeout=10).json()["active"] == "r1"
