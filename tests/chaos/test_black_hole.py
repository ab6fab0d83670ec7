"""Backends that accept connections and never answer: the client gets its answer, or a 504 in
OpenAI's shape, within the routing deadline, whatever the per-attempt timeouts add up to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import deployment, gateway_config
from tests.chaos.replicas import black_hole, parse, replicas_on_redis, text_of

pytestmark = pytest.mark.chaos

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello?"}], "max_tokens": 8}
RPM = 1000
# Per attempt alone these would keep a client 3 x 20 s; the deadline is what bounds the wait.
SLOW_TIMEOUTS = {"connect_s": 20, "first_token_s": 20, "stall_s": 20}


def hole(name: str, url: str, **overrides: Any) -> dict[str, Any]:
    return {"name": name, "api_base": f"{url}/v1", "model": "sim-model", "timeouts": SLOW_TIMEOUTS, **overrides}


def post(url: str, headers: dict[str, str], stream: bool) -> httpx.Response:
    # The client's own timeout is generous: the gateway's deadline must end the wait first.
    return httpx.post(f"{url}/v1/chat/completions", json={**BODY, "stream": stream}, headers=headers, timeout=30)


def test_only_black_holes_answer_504_at_the_deadline(tmp_path: Path) -> None:
    with black_hole() as first, black_hole() as second:
        config = gateway_config(
            hole("a", first),
            hole("b", second, priority=1),
            # Breakers stay closed, so that every request makes all its attempts.
            routing={"deadline_s": 1.0, "retry": {"max_attempts": 3}, "breaker": {"failure_threshold": 100}},
        )
        with replicas_on_redis(tmp_path, config, count=1) as group:
            group.use_key(rpm=RPM)
            gateway = group.live[0]
            for stream in (False, True, False, True):
                reply = post(gateway.url, gateway.headers(), stream)
                assert reply.status_code == 504, reply.text
                error = reply.json()["error"]
                assert error["code"] == "deadline_exceeded"
                assert set(error) == {"message", "type", "param", "code"}
            records = group.audit_when(lambda found: len(found) >= 4)
            assert [r["status"] for r in records] == [504] * 4
            assert all(r["error"] == "deadline_exceeded" for r in records)
            assert group.verify()["ok"]


def test_a_black_hole_primary_leaves_time_for_the_healthy_secondary(tmp_path: Path, sim: Announced) -> None:
    with black_hole() as url:
        config = gateway_config(
            hole("a", url), deployment("b", sim, priority=1), routing={"deadline_s": 4.0, "retry": {"max_attempts": 3}}
        )
        with replicas_on_redis(tmp_path, config, count=1) as group:
            group.use_key(rpm=RPM)
            gateway = group.live[0]
            for stream in (False, True):
                reply = post(gateway.url, gateway.headers(), stream)
                assert reply.status_code == 200, reply.text
                if stream:
                    assert text_of(parse(reply.text.splitlines()))
                else:
                    assert reply.json()["choices"][0]["message"]["content"]
            records = group.audit_when(lambda found: len(found) >= 2)
            assert [r["status"] for r in records] == [200, 200]
            assert [a["deployment"] for a in records[0]["attempts"]] == ["a", "b"]
            assert group.remaining_requests() == RPM - 3
            assert group.verify()["ok"]
