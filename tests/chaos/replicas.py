"""Helpers of the replica-kill, slow-primary and black-hole scenarios: two gateway replicas on one
Redis (a unique key prefix on the shared server), SSE parsing, and the "nothing lost" checks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from common.sse_reader import read_events
from gateway.auth.stage import new_secret
from testkit.procs import GatewayProcess, delete_redis_prefix, gateway_process, redis_store_config


@dataclass
class Replicas:
    """Gateway processes (replicas) sharing one store, one admin key and one chat key."""

    tmp_path: Path
    config: dict[str, Any]
    admin_key: str
    stack: ExitStack
    live: list[GatewayProcess] = field(default_factory=list)

    def start(self) -> GatewayProcess:
        gateway = self.stack.enter_context(gateway_process(self.tmp_path, self.config, admin_key=self.admin_key))
        if self.live:
            gateway.key = self.live[0].key
        self.live.append(gateway)
        return gateway

    def use_key(self, **fields: Any) -> str:
        """A new chat key (limits in `fields`) that every replica's `headers()` then sends."""
        secret = self.live[0].create_key(**fields)[1]
        for gateway in self.live:
            gateway.key = secret
        return secret

    def remaining_requests(self) -> int:
        """The key's RPM left, as a fresh request is told it (that request counts too)."""
        gateway = self.live[0]
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "count"}], "max_tokens": 1}
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=30)
        assert reply.status_code == 200, reply.text
        return int(reply.headers["x-ratelimit-remaining-requests"])

    def kill(self, gateway: GatewayProcess) -> None:
        os.kill(gateway.process.process.pid, signal.SIGKILL)
        gateway.process.process.wait(10)
        self.live.remove(gateway)

    def audit(self, kind: str = "request") -> list[dict[str, Any]]:
        gateway = self.live[0]
        records: list[dict[str, Any]] = []
        after = 0
        for _ in range(100):  # pages of 10,000: bounded
            reply = httpx.get(
                f"{gateway.url}/admin/audit",
                params={"kind": kind, "after_seq": after, "limit": 10_000},
                headers=gateway.headers(gateway.admin_key),
                timeout=30,
            )
            reply.raise_for_status()
            records += reply.json()["data"]
            after = reply.json()["next_after_seq"]
            if after is None:
                return records
        raise AssertionError("audit log longer than expected")

    def audit_when(
        self, done: Callable[[list[dict[str, Any]]], bool], kind: str = "request", deadline_s: float = 20.0
    ) -> list[dict[str, Any]]:
        """The records once `done` holds for them, or as they are at the deadline: the writer
        flushes in batches after the answer, so a record can land a moment after its response."""
        deadline = time.monotonic() + deadline_s
        while not done(records := self.audit(kind)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return records

    def verify(self) -> dict[str, Any]:
        gateway = self.live[0]
        reply = httpx.get(f"{gateway.url}/admin/audit/verify", headers=gateway.headers(gateway.admin_key), timeout=30)
        reply.raise_for_status()
        verdict: dict[str, Any] = reply.json()
        return verdict


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """The URL of a server that accepts connections (the kernel completes the handshake) and
    never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@contextlib.contextmanager
def replicas_on_redis(tmp_path: Path, config: dict[str, Any], count: int = 2) -> Iterator[Replicas]:
    prefix = f"agw-chaos-{uuid.uuid4().hex[:12]}"
    try:
        with ExitStack() as stack:
            group = Replicas(tmp_path, {**config, "store": redis_store_config(prefix)}, new_secret(), stack)
            for _ in range(count):
                group.start()
            yield group
    finally:
        delete_redis_prefix(prefix)


def parse(lines: list[str]) -> list[tuple[int | None, Any]]:
    """(id, payload) of each SSE event of these lines (the last one counts before its blank line)."""
    return [
        (int(seq) if seq else None, "[DONE]" if data == b"[DONE]" else orjson.loads(data))
        for data, _, seq in read_events("\n".join(lines) + "\n")
    ]


def text_of(events: list[tuple[int | None, Any]]) -> str:
    return "".join(
        p["choices"][0]["delta"].get("content") or "" for _, p in events if p != "[DONE]" and p.get("choices")
    )


def usage_of(events: list[tuple[int | None, Any]]) -> dict[str, Any] | None:
    usages = [p["usage"] for _, p in events if p != "[DONE]" and p.get("usage")]
    return usages[-1] if usages else None


def resume(gateway: GatewayProcess, session_id: str, last_id: int) -> list[tuple[int | None, Any]]:
    headers = {**gateway.headers(), "Last-Event-ID": str(last_id)}
    reply = httpx.get(f"{gateway.url}/v1/sessions/{session_id}/stream", headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text
    return parse(reply.text.splitlines())
