"""The release smoke gate judges what was measured about the release, never the measuring process,
and its refusal names the real reason."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.candidate_listener import serve_once
from gateway.releases.smoke import run_smoke, smoke_command, smoke_verdict
from gateway.store.release_record import SmokePin
from replay.metrics import Slo, summarize
from replay.record import RequestRecord
from replay.report import result_document
from sim.app import create_sim_app
from sim.profile import SimProfile
from tests.replay.conftest import chat_body, running_sim, write_jsonl


def record(index: int, ttft_s: float, ok: bool = True, client_delay_s: float = 0.0005) -> RequestRecord:
    done = RequestRecord(index, f"s{index}", True, start_s=0.0, setup_s=0.0, status=200 if ok else 503)
    done.output_times_s = [ttft_s, ttft_s + 0.01]
    done.ttft_s, done.e2e_s, done.output_tokens, done.ok = ttft_s, ttft_s + 0.01, 2, ok
    done.client_delay_s = client_delay_s
    done.timing_ok = client_delay_s <= 0.002
    if not ok:
        done.reason, done.detail = "http_503", "HTTP 503: simulated HTTP 503"
    return done


def result(records: list[RequestRecord], slo_ttft_s: float | None = None) -> dict[str, Any]:
    slos = [Slo("ttft", slo_ttft_s)] if slo_ttft_s is not None else []
    summary = summarize(records, wall_s=1.0, slos=slos)
    # The measuring process was busy: replay marks the run invalid. The gate must not care.
    return result_document(run={}, records=records, summary=summary, gates=[], problems=["tool too busy"])


def test_a_release_that_met_its_bar_passes_even_when_the_measuring_process_was_busy() -> None:
    busy = [record(n, 0.05, client_delay_s=0.2) for n in range(4)]
    assert smoke_verdict(result(busy, slo_ttft_s=0.5), min_goodput=1.0) is None
    assert smoke_verdict(result(busy), min_goodput=1.0) is None


def test_failed_requests_are_named_with_their_reason() -> None:
    verdict = smoke_verdict(result([record(0, 0.05), record(1, 0.05, ok=False)]), min_goodput=1.0)
    assert verdict is not None
    assert verdict.startswith("1 of 2 requests failed: http_503 x1 (e.g. HTTP 503: simulated HTTP 503)")
    assert "success rate" not in verdict


def test_a_missed_slo_names_the_slo_and_what_was_measured() -> None:
    verdict = smoke_verdict(result([record(n, 0.3) for n in range(4)], slo_ttft_s=0.1), min_goodput=1.0)
    assert (
        verdict == "goodput 0.00 below the required 1: 4 of 4 requests missed ttft<=100ms (measured ttft p50 300.0 ms)"
    )


def test_a_miss_only_the_tools_own_delay_explains_is_not_held_against_the_release() -> None:
    records = [record(0, 0.101, client_delay_s=0.02), record(1, 0.05)]
    assert smoke_verdict(result(records, slo_ttft_s=0.1), min_goodput=1.0) is None


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with running_sim("--ttft-ms", "5", "--tpot-ms", "1", "--jitter", "0") as url:
        yield url


def smoke(tmp_path: Path, slo_ttft_ms: float | None = None) -> SmokePin:
    samples = write_jsonl(tmp_path / "smoke.jsonl", [chat_body(n) for n in range(4)])
    return SmokePin(samples=str(samples), count=4, slo_ttft_ms=slo_ttft_ms, min_goodput=1.0)


def test_the_smoke_run_against_a_real_server_passes_and_refuses_for_the_real_reason(sim: str, tmp_path: Path) -> None:
    assert asyncio.run(run_smoke(smoke(tmp_path, slo_ttft_ms=5000), sim, "", "sim-model")) is None
    refused = asyncio.run(run_smoke(smoke(tmp_path, slo_ttft_ms=0.001), sim, "", "sim-model"))
    assert refused is not None
    assert refused.startswith("goodput 0.00 below the required 1: 4 of 4 requests missed ttft<=0.001ms"), refused


def test_a_smoke_run_that_cannot_start_says_why(tmp_path: Path) -> None:
    broken = dataclasses.replace(smoke(tmp_path), samples=str(tmp_path / "missing.jsonl"))
    refused = asyncio.run(run_smoke(broken, "http://127.0.0.1:9/v1", "", "sim-model"))
    assert refused is not None
    assert refused.startswith("the replay did not run (exit 2)")
    assert "missing.jsonl" in refused


def test_the_key_and_the_address_reach_the_replay_in_its_environment_not_on_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "the-gateways-own-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://elsewhere/v1")
    command, env = smoke_command(
        smoke(tmp_path), tmp_path / "s.jsonl", "http://127.0.0.1:7/v1", "sk-one-time", "m", tmp_path / "out.json"
    )
    assert not any("sk-one-time" in part or "127.0.0.1:7" in part for part in command), command
    assert (env["REPLAY_API_KEY"], env["REPLAY_BASE_URL"]) == ("sk-one-time", "http://127.0.0.1:7/v1")
    assert "OPENAI_API_KEY" not in env
    assert "OPENAI_BASE_URL" not in env
    _, keyless = smoke_command(smoke(tmp_path), tmp_path / "s.jsonl", "http://x/v1", "", "m", tmp_path / "o.json")
    assert "REPLAY_API_KEY" not in keyless, "no key: none is sent, not the environment's"


def fast_sim() -> ASGIApp:
    return create_sim_app(SimProfile(ttft_ms=2, tpot_ms=1, jitter=0))


def test_a_smoke_run_gets_through_a_listener_that_takes_only_its_token(tmp_path: Path) -> None:
    async def both() -> tuple[str | None, str | None]:
        async with serve_once(fast_sim()) as listener:
            passed = await run_smoke(smoke(tmp_path), listener.base_url, listener.token, "sim-model")
            refused = await run_smoke(smoke(tmp_path), listener.base_url, "not-the-token", "sim-model")
        return passed, refused

    passed, refused = asyncio.run(both())
    assert passed is None
    assert refused is not None
    assert refused.startswith("4 of 4 requests failed: http_401"), refused


def test_a_direct_smoke_run_puts_the_releases_system_prompt_in_front_of_every_sample(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []
    sim = fast_sim()

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await sim(scope, receive, send)
            return
        first: Message = await receive()
        body = first.get("body", b"")
        while first.get("more_body"):
            first = await receive()
            body += first.get("body", b"")
        bodies.append(orjson.loads(body))
        replayed = False

        async def again() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await sim(scope, again, send)

    async def run() -> str | None:
        async with serve_once(recording) as listener:
            return await run_smoke(smoke(tmp_path), listener.base_url, listener.token, "sim-model", "You are v2.")

    assert asyncio.run(run()) is None
    assert len(bodies) == 4
    for body in bodies:
        assert body["messages"][0] == {"role": "system", "content": "You are v2."}, body
        assert body["messages"][1]["role"] == "user"


def test_the_system_prompt_copy_keeps_each_samples_category_timestamp_and_expectations(tmp_path: Path) -> None:
    from gateway.releases.smoke import _with_system_prompt
    from replay.samples import load_samples

    original = tmp_path / "samples.jsonl"
    user = {"role": "user", "content": "hi"}
    lines = [
        {"id": "a", "category": "tools", "timestamp": 100.5, "body": {"messages": [user]}, "expect_tool_call": True},
        {"id": "b", "timestamp": "2026-01-01T00:00:00Z", "messages": [user], "expect_finish_reason": "stop"},
    ]
    original.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    copy = _with_system_prompt(original, "You are v2.", tmp_path / "copy.jsonl")
    before, after = load_samples(original).samples, load_samples(copy).samples
    for old, new in zip(before, after, strict=True):
        assert new.body["messages"] == [{"role": "system", "content": "You are v2."}, user]
        assert {k: v for k, v in new.body.items() if k != "messages"} == {}, "sample metadata sent as request fields"
        kept = ("id", "category", "timestamp", "expect_finish_reason", "expect_tool_call")
        assert [getattr(new, k) for k in kept] == [getattr(old, k) for k in kept]


def test_the_smoke_child_gets_its_own_session_and_no_inherited_socket_under_uvloop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """uvloop's subprocess support keeps inheritable descriptors open: a smoke child outliving a
    crashed gateway held the gateway's port (its listening socket is inheritable)."""
    import uvloop

    from gateway.releases import smoke as smoke_module

    seen = tmp_path / "child.json"
    probe = (
        "import json, os; links = [os.readlink(f'/proc/self/fd/{fd}') for fd in os.listdir('/proc/self/fd')"
        " if os.path.exists(f'/proc/self/fd/{fd}')];"
        " json.dump({'fds': links, 'sid': os.getsid(0), 'pid': os.getpid()},"
        f" open({str(seen)!r}, 'w'))"
    )
    monkeypatch.setattr(smoke_module, "smoke_command", lambda *args: ([sys.executable, "-c", probe], dict(os.environ)))
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    listening.set_inheritable(True)  # as the gateway's own listening socket is
    socket_link = f"socket:[{os.fstat(listening.fileno()).st_ino}]"  # by what it is, not its number
    try:
        problem = uvloop.run(run_smoke(smoke(tmp_path), "http://127.0.0.1:9/v1", "", "sim-model"))
    finally:
        listening.close()
    assert problem is not None
    assert problem.startswith("the replay did not run (exit 0)"), problem
    child = json.loads(seen.read_text())
    assert child["sid"] == child["pid"] != os.getsid(0), "the smoke child leads its own session"
    assert child["fds"], "the listing ran"
    assert socket_link not in child["fds"], "the smoke child inherited a listening socket"
