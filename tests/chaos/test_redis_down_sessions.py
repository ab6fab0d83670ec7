"""Session-bearing requests during a real store outage (issue 29 item 7): agents always send
X-Session-Id, and a Redis outage used to fail every one of them with 503 whatever
`quota.on_store_error` said. With `sessions.on_store_error: serve_unresumable` (the default) they
are answered without a checkpoint and say so (`X-Session-Resumable: false`); a later resume of
such an answer is a clear 409, not the previous answer's events; `fail_closed` answers 503."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import GatewayProcess, deployment, gateway_config, gateway_process
from tests.chaos.redis_chaos import PrivateRedis, private_redis

pytestmark = pytest.mark.chaos

BODY: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "keep going"}], "max_tokens": 4}
REQUESTS_PER_OUTAGE = 8


def config(server: PrivateRedis, sim: Announced, on_store_error: str) -> dict[str, Any]:
    return gateway_config(
        deployment("a", sim),
        store={"kind": "redis", "url": server.url, "key_prefix": "sessions-down"},
        quota={"on_store_error": "fail_open"},  # the quota's own setting; this test is about sessions'
        sessions={"on_store_error": on_store_error} if on_store_error else {},
    )


def ask(gateway: GatewayProcess, session_id: str, *, stream: bool) -> httpx.Response:
    headers = {**gateway.headers(), "X-Session-Id": session_id}
    body = {**BODY, "stream": stream}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=20)


def resumed(gateway: GatewayProcess, session_id: str) -> httpx.Response:
    url = f"{gateway.url}/v1/sessions/{session_id}/stream"
    return httpx.get(url, headers=gateway.headers(), timeout=10)


class Outage:
    """The store going away as `kind` says (SIGKILL: refused connections; SIGSTOP: a frozen
    server, every call times out) and coming back."""

    def __init__(self, server: PrivateRedis, kind: str) -> None:
        self.server, self.kind = server, kind

    def begin(self) -> None:
        assert self.server.process is not None
        if self.kind == "sigkill":
            self.server.kill()
        else:
            os.kill(self.server.process.pid, signal.SIGSTOP)

    def end(self) -> None:
        assert self.server.process is not None
        if self.kind == "sigkill":
            self.server.start()
        else:
            os.kill(self.server.process.pid, signal.SIGCONT)


def during(gateway: GatewayProcess, outage: Outage, session_ids: list[str]) -> list[httpx.Response]:
    outage.begin()
    try:
        return [ask(gateway, sid, stream=i % 2 == 0) for i, sid in enumerate(session_ids)]
    finally:
        outage.end()


def until_not_resumable(gateway: GatewayProcess, session_id: str, within_s: float = 20) -> httpx.Response:
    """The resume of an answer served without a checkpoint, once the store has heard of it (the
    gateway marks the session when the store is back, in the background)."""
    deadline = time.monotonic() + within_s
    while True:
        reply = resumed(gateway, session_id)
        if reply.status_code == 409 or time.monotonic() > deadline:
            return reply
        time.sleep(0.1)


@pytest.mark.parametrize("kind", ["sigkill", "sigstop"])
def test_serve_unresumable_answers_session_requests_through_an_outage(
    tmp_path: Path, sim: Announced, kind: str
) -> None:
    with private_redis(tmp_path) as server, gateway_process(tmp_path, config(server, sim, "serve_unresumable")) as gw:
        known = f"s-{uuid.uuid4().hex[:8]}"
        assert ask(gw, known, stream=True).status_code == 200  # the key is cached, the session stored
        session_ids = [known, *(f"s-{uuid.uuid4().hex[:8]}" for _ in range(REQUESTS_PER_OUTAGE - 1))]
        replies = during(gw, Outage(server, kind), session_ids)
        for index, reply in enumerate(replies):
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-session-resumable"] == "false"
            if index % 2 == 0:
                assert reply.text.endswith("data: [DONE]\n\n")
                assert '"error"' not in reply.text
            else:
                assert reply.json()["choices"][0]["message"]["content"]
        # After the outage: resuming what was served without a checkpoint says so, clearly.
        refused = until_not_resumable(gw, known)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "session_not_resumable"
        assert "without a checkpoint" in error["message"]
        # And the session works as before for its next answer.
        again = ask(gw, known, stream=True)
        assert again.status_code == 200
        assert "x-session-resumable" not in again.headers
        assert resumed(gw, known).text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize("kind", ["sigkill", "sigstop"])
def test_fail_closed_refuses_session_requests_during_an_outage(tmp_path: Path, sim: Announced, kind: str) -> None:
    with private_redis(tmp_path) as server, gateway_process(tmp_path, config(server, sim, "fail_closed")) as gw:
        known = f"s-{uuid.uuid4().hex[:8]}"
        assert ask(gw, known, stream=True).status_code == 200
        session_ids = [known, *(f"s-{uuid.uuid4().hex[:8]}" for _ in range(REQUESTS_PER_OUTAGE - 1))]
        replies = during(gw, Outage(server, kind), session_ids)
        for reply in replies:
            assert reply.status_code == 503, reply.text
            assert reply.json()["error"]["code"] == "store_unavailable"
        assert ask(gw, known, stream=True).status_code == 200  # back with the store


def test_an_appending_request_needs_the_stored_history_and_is_refused_during_an_outage(
    tmp_path: Path, sim: Announced
) -> None:
    """X-Session-Append answers from the stored transcript: without it the answer would be to a
    conversation the client never had, so it is a 503 under either setting."""
    with private_redis(tmp_path) as server, gateway_process(tmp_path, config(server, sim, "serve_unresumable")) as gw:
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        assert ask(gw, session_id, stream=False).status_code == 200
        outage = Outage(server, "sigkill")
        outage.begin()
        try:
            headers = {**gw.headers(), "X-Session-Id": session_id, "X-Session-Append": "true"}
            reply = httpx.post(f"{gw.url}/v1/chat/completions", json=BODY, headers=headers, timeout=20)
        finally:
            outage.end()
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "store_unavailable"
