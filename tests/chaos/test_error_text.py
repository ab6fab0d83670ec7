"""What clients are told when something breaks (issue 29 item 8): the gateway's own words and the
request's id, never an address, a port, an exception class or a library's message.

The faults are real: Redis SIGKILLed and then SIGSTOPped under two gateways with sessions, quota
(fail open on one, fail closed on the other) and audit; a backend cut, stalled or failing
mid-stream, with sessions and without; an MCP upstream gone, and the store gone under the MCP
endpoint. Every 4xx/5xx body and every in-band error event is checked (tests/support/leaks.py),
every 5xx names its request id, and the detail the client was spared is in the gateway's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import orjson
import pytest

from common.processes import Announced, start_announcing
from common.sse_reader import read_events
from gateway.auth.stage import new_secret
from testkit.procs import GatewayProcess, deployment, gateway_config, gateway_process, policy_file, set_faults
from tests.chaos.redis_chaos import PrivateRedis, private_redis, wait_ready
from tests.support.leaks import assert_none_leak, error_messages, internals_in, leaks_of

pytestmark = pytest.mark.chaos

PREFIX = "leaks"
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "what broke?"}], "max_tokens": 4}


@dataclass
class Seen:
    """Every reply of a scenario, by label: what leaked, and the 5xx replies without their id."""

    leaks: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    unnamed: list[str] = field(default_factory=list)  # 5xx (or in-band) errors that do not name the request id
    request_ids: dict[str, str] = field(default_factory=dict)

    def add(self, label: str, reply: httpx.Response, request_id: str | None) -> None:
        self.leaks += leaks_of(reply, label)
        self.statuses[label] = reply.status_code
        messages = error_messages(reply)
        server_side = reply.status_code >= 500 or (reply.status_code == 200 and messages)
        if server_side and request_id is not None:
            self.request_ids[label] = request_id
            if not messages or any(request_id not in m for m in messages):
                self.unnamed.append(f"{label}: {messages or reply.text[:200]}")
            if reply.headers.get("x-request-id") != request_id:
                self.unnamed.append(f"{label}: X-Request-Id header {reply.headers.get('x-request-id')!r}")

    def failed(self) -> list[str]:
        return [label for label, status in self.statuses.items() if status >= 500]


def _request_id(label: str) -> str:
    return f"leak-{label.replace(' ', '-')}-{uuid.uuid4().hex[:8]}"


def chat(
    seen: Seen,
    label: str,
    gateway: GatewayProcess,
    key: str | None = None,
    *,
    stream: bool = False,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    request_id = _request_id(label)
    sent = {**gateway.headers(key), "X-Request-Id": request_id, **(headers or {})}
    body = {**BODY, "stream": stream}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, headers=sent) as reply,
    ):
        reply.read()
    seen.add(label, reply, request_id)
    return reply


def get(seen: Seen, label: str, gateway: GatewayProcess, path: str, key: str, **headers: str) -> httpx.Response:
    request_id = _request_id(label)
    sent = {**gateway.headers(key), "X-Request-Id": request_id, **headers}
    reply = httpx.get(f"{gateway.url}{path}", headers=sent, timeout=30)
    seen.add(label, reply, request_id)
    return reply


def store(server: PrivateRedis) -> dict[str, Any]:
    return {"kind": "redis", "url": server.url, "key_prefix": PREFIX, "socket_timeout_s": 0.5, "connect_timeout_s": 0.5}


@dataclass
class Pair:
    """Two replicas on one Redis: `lenient` fails open on quota, `strict` fails closed and has a
    tiny audit queue (so an outage soon fills it); one admin key, the same chat keys."""

    lenient: GatewayProcess
    strict: GatewayProcess
    metered: str  # a key with an RPM limit: the quota store is asked on every request
    session_id: str  # a session with one streamed answer, made before the fault


@contextlib.contextmanager
def pair_on(tmp_path: Path, sim: Announced, server: PrivateRedis, log: IO[str]) -> Iterator[Pair]:
    common = {"store": store(server), "routing": {"retry": {"max_attempts": 1}}}
    lenient = gateway_config(deployment("a", sim), quota={"on_store_error": "fail_open"}, **common)
    strict = gateway_config(
        deployment("a", sim),
        quota={"on_store_error": "fail_closed"},
        audit={"queue_size": 2, "reserve_wait_s": 0.2, "flush_interval_s": 0.01},
        **common,
    )
    admin_key = new_secret()
    with ExitStack() as stack:
        first = stack.enter_context(gateway_process(tmp_path, lenient, admin_key=admin_key, stderr=log))
        second = stack.enter_context(gateway_process(tmp_path, strict, admin_key=admin_key, stderr=log))
        second.key = first.key
        _, metered = first.create_key(rpm=100_000)
        session_id = f"leak-session-{uuid.uuid4().hex[:8]}"
        warm = Seen()
        for gateway in (first, second):  # both cache both keys: they keep working while Redis is down
            assert chat(warm, "warm", gateway).status_code == 200
            assert chat(warm, "warm metered", gateway, metered).status_code == 200
        done = chat(warm, "warm session", first, stream=True, headers={"X-Session-Id": session_id})
        assert done.status_code == 200
        assert done.content.rstrip().endswith(b"[DONE]")
        yield Pair(first, second, metered, session_id)


def probe_store_outage(seen: Seen, pair: Pair, phase: str) -> None:
    """Everything a client can meet while the store is away, on both replicas."""
    lenient, strict = pair.lenient, pair.strict
    for name, gateway in (("lenient", lenient), ("strict", strict)):
        label = f"{phase} {name}"
        chat(seen, f"{label} plain", gateway)
        chat(seen, f"{label} metered", gateway, pair.metered)
        chat(seen, f"{label} metered stream", gateway, pair.metered, stream=True)
        chat(seen, f"{label} session", gateway, headers={"X-Session-Id": f"leak-{uuid.uuid4().hex[:8]}"})
        chat(
            seen, f"{label} session stream", gateway, stream=True, headers={"X-Session-Id": f"leak-{uuid.uuid4().hex}"}
        )
        chat(seen, f"{label} session append", gateway, headers={"X-Session-Append": pair.session_id})
        path = f"/v1/sessions/{pair.session_id}/stream"
        get(seen, f"{label} resume", gateway, path, gateway.key, **{"Last-Event-ID": "0"})
        get(seen, f"{label} admin keys", gateway, "/admin/keys", gateway.admin_key)
    for n in range(4):  # the strict replica's audit queue (2) fills while nothing can be written
        chat(seen, f"{phase} strict audit {n}", strict)


def fresh_keys(pair: Pair) -> list[str]:
    return [pair.lenient.create_key()[1] for _ in range(2)]


def probe_unknown_keys(seen: Seen, pair: Pair, phase: str, keys: list[str]) -> None:
    """Keys no replica has cached: the lookup itself needs the store."""
    chat(seen, f"{phase} uncached key", pair.lenient, keys[0])
    get(seen, f"{phase} uncached key models", pair.strict, "/v1/models", keys[1])


def wait_replicas(pair: Pair) -> None:
    for gateway in (pair.lenient, pair.strict):
        asyncio.run(wait_ready(gateway, within_s=30))


def test_store_outages_tell_clients_nothing_internal(tmp_path: Path, sim_pair: list[Announced]) -> None:
    log_path = tmp_path / "gateways.log"
    seen = Seen()
    with (
        log_path.open("w") as log,
        private_redis(tmp_path) as server,
        pair_on(tmp_path, sim_pair[0], server, log) as pair,
    ):
        keys = fresh_keys(pair)
        server.kill()  # refused connections: redis-py's "Error 111 connecting to 127.0.0.1:<port>"
        probe_store_outage(seen, pair, "killed")
        probe_unknown_keys(seen, pair, "killed", keys)
        server.start()
        wait_replicas(pair)
        keys = fresh_keys(pair)
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)  # a frozen server: "Timeout reading from ..."
        try:
            probe_store_outage(seen, pair, "stopped")
            probe_unknown_keys(seen, pair, "stopped", keys)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    logged = log_path.read_text()
    failed = seen.failed()
    print(f"\n{len(seen.statuses)} replies, {len(failed)} of them 5xx: {sorted(failed)}")
    # The faults reached clients, by every path that cannot be served without the store.
    for wanted in ("strict metered", "strict audit", "uncached key", "admin keys", "resume"):
        assert any(wanted in label for label in failed), f"no 5xx for {wanted!r}: {seen.statuses}"
    assert_none_leak(seen.leaks)
    assert not seen.unnamed, "\n".join(seen.unnamed)
    # What the client was spared is in the log, under the request's id.
    for label in ("killed strict metered", "stopped strict metered", "killed lenient admin keys"):
        request_id = seen.request_ids[label]
        lines = [line for line in logged.splitlines() if request_id in line]
        assert any("redis" in line.lower() for line in lines), (label, lines[:3])


@pytest.mark.parametrize("sessions", [True, False], ids=["sessions", "no-sessions"])
def test_a_backend_failing_mid_answer_tells_clients_nothing_internal(
    tmp_path: Path, sims: list[Announced], sessions: bool
) -> None:
    sim = sims[0]
    config = gateway_config(
        # No continuation: a cut answer cannot be resumed, so the client meets the failure.
        deployment("a", sim, continuation="none", timeouts={"connect_s": 1, "first_token_s": 2, "stall_s": 0.5}),
        # Each fault reaches the deployment: its breaker does not open on the first few.
        routing={"retry": {"max_attempts": 1}, "breaker": {"failure_threshold": 100}},
        sessions={"enabled": sessions},
    )
    seen = Seen()
    faults: list[tuple[str, dict[str, Any]]] = [
        ("cut", {"cut_after": 2}),
        ("stall", {"stall_after": 2}),
        ("inband", {"inband_error_after": 2}),
        ("malformed", {"malformed_after": 2}),
        ("status", {"status": 500}),
        ("cut at once", {"cut_after": 0}),
    ]
    with gateway_process(tmp_path, config) as gateway:
        for name, fault in faults:
            set_faults(sim, **fault)
            chat(seen, f"{name} stream", gateway, stream=True)
            chat(seen, f"{name}", gateway)
    in_band = [label for label, status in seen.statuses.items() if status == 200 and label in seen.request_ids]
    print(f"\nstatuses {seen.statuses}; in-band errors: {in_band}")
    assert len(seen.failed()) + len(in_band) >= len(faults) * 2 - 1, seen.statuses  # every fault showed
    assert_none_leak(seen.leaks)
    assert not seen.unnamed, "\n".join(seen.unnamed)


MCP_POLICY = """
policies:
  agent:
    approval: {mode: wait, timeout_s: 5, ttl_s: 600}
    tools:
      - {name: files__read_file, risk: low}
      - {name: files__delete_file, risk: high}
bindings:
  tenants: {acme: agent}
"""
MCP_SECRET = "leak-test-approval-secret-0123456789"


def _mcp_call(gateway: GatewayProcess, key: str, tool: str, arguments: dict[str, Any]) -> httpx.Response:
    """One stateless MCP `tools/call`, as raw HTTP (the reply may be an HTTP error, an SSE stream
    or JSON), so that every byte the client gets can be checked."""
    headers = {**gateway.headers(key), "Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return httpx.post(f"{gateway.url}/mcp", json=body, headers=headers, timeout=60)


def _mcp_texts(reply: httpx.Response) -> list[str]:
    """What of an MCP reply a client reads as words: an HTTP error's body; else, of each JSON-RPC
    message (JSON or SSE), a tool result's texts, an error, a progress notification's message."""
    if reply.status_code >= 400:
        return [reply.text]
    bodies = (
        [data for data, _, _ in read_events(reply.content)]
        if "event-stream" in reply.headers.get("content-type", "")
        else [reply.content]
    )
    texts: list[str] = []
    for body in bodies:
        message = orjson.loads(body)
        if "error" in message:
            texts.append(orjson.dumps(message["error"]).decode())
        texts += [c.get("text", "") for c in (message.get("result") or {}).get("content", [])]
        if "params" in message and "message" in message["params"]:
            texts.append(str(message["params"]["message"]))
    return texts


def test_mcp_faults_tell_clients_nothing_internal(tmp_path: Path, sim_pair: list[Announced]) -> None:
    upstream = start_announcing(
        ["testkit.mcp_upstream", "--http"], env={"AGW_APPROVAL_SECRET": MCP_SECRET, "AGW_NAMESPACE": "files"}
    )
    texts: list[tuple[str, int, str]] = []
    try:
        with private_redis(tmp_path) as server:
            config = gateway_config(
                deployment("a", sim_pair[0]),
                store=store(server),
                quota={"on_store_error": "fail_closed"},
                tools={"policy_file": policy_file(tmp_path, MCP_POLICY), "approval_secret": MCP_SECRET},
                mcp={"servers": [{"name": "files", "url": upstream.url, "call_timeout_s": 2}]},
            )
            with gateway_process(tmp_path, config) as gateway:
                _, metered = gateway.create_key(rpm=100_000)
                _, uncached = gateway.create_key()
                deadline = time.monotonic() + 30
                while True:  # the upstream is listed once the gateway's session to it is up
                    ready = httpx.get(f"{gateway.url}/readyz", timeout=10).json()
                    if ready["mcp_servers"].get("files") == "up":
                        break
                    assert time.monotonic() < deadline, ready
                    time.sleep(0.05)
                for key in (gateway.key, metered):  # both keys cached before the store goes
                    reply = _mcp_call(gateway, key, "files__read_file", {"path": "/srv/a"})
                    assert reply.status_code == 200, reply.text
                    assert "contents of /srv/a" in reply.text, reply.text
                server.kill()
                for label, key, tool, arguments in [
                    ("uncached key", uncached, "files__read_file", {"path": "/srv/a"}),
                    ("metered", metered, "files__read_file", {"path": "/srv/a"}),
                    ("held for approval", gateway.key, "files__delete_file", {"path": "/tmp/x"}),
                ]:
                    reply = _mcp_call(gateway, key, tool, arguments)
                    texts += [(f"store killed: {label}", reply.status_code, t) for t in _mcp_texts(reply)]
                upstream.stop()  # the upstream gone too
                reply = _mcp_call(gateway, gateway.key, "files__read_file", {"path": "/srv/a"})
                texts += [("upstream gone", reply.status_code, t) for t in _mcp_texts(reply)]
    finally:
        upstream.stop()
    print("\n" + "\n".join(f"{label}: {status} {text[:200]}" for label, status, text in texts))
    assert any(status >= 500 for _, status, _ in texts), "the uncached key never met the outage"
    findings = [
        f"{label} (HTTP {status}): {f} in {text[:300]!r}" for label, status, text in texts for f in internals_in(text)
    ]
    assert_none_leak(findings)
