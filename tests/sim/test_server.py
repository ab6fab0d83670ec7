"""The sim as a real process on a real socket, as demos and failure drills run it."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.sim.sse import DONE, content_tokens, sse_events

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PREFIX = "sim listening on "
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12}


def _read_ready_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], timeout)
    if not readable:
        raise AssertionError("sim did not report readiness in time")
    return proc.stdout.readline()


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "sim", "--port", "0", "--ttft-ms", "5", "--tpot-ms", "2"]
    with subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            line = _read_ready_line(proc, timeout=30)
            assert line.startswith(READY_PREFIX), line
            url = line.removeprefix(READY_PREFIX).strip()
            assert url.startswith("http://127.0.0.1:")
            assert url.endswith("/v1")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _stream(client: httpx.Client, url: str, fault: str | None, received: list[str]) -> None:
    headers = {"X-Sim-Fault": fault} if fault else {}
    body = {**BODY, "stream": True}
    with client.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(line.removeprefix("data: "))


def test_subprocess_serves_a_complete_stream(sim_url: str) -> None:
    received: list[str] = []
    with httpx.Client(timeout=10) as client:
        _stream(client, sim_url, None, received)
    assert received[-1] == DONE
    events = sse_events("".join(f"data: {p}\n\n" for p in received))
    assert len(content_tokens(events)) == 12


def test_cut_fault_leaves_the_client_with_an_incomplete_stream(sim_url: str) -> None:
    received: list[str] = []
    with httpx.Client(timeout=10) as client, pytest.raises(httpx.RemoteProtocolError):
        _stream(client, sim_url, "cut_after=5", received)
    assert DONE not in received
    events = sse_events("".join(f"data: {p}\n\n" for p in received))
    assert len(content_tokens(events)) == 5


def test_cut_fault_on_a_non_stream_request_breaks_the_body(sim_url: str) -> None:
    with httpx.Client(timeout=10) as client, pytest.raises(httpx.RemoteProtocolError):
        client.post(f"{sim_url}/chat/completions", json=BODY, headers={"X-Sim-Fault": "cut_after=3"})


def test_stall_fault_makes_the_client_time_out(sim_url: str) -> None:
    received: list[str] = []
    timeout = httpx.Timeout(10, read=0.5)
    with httpx.Client(timeout=timeout) as client, pytest.raises(httpx.ReadTimeout):
        _stream(client, sim_url, "stall_after=3", received)
    events = sse_events("".join(f"data: {p}\n\n" for p in received))
    assert len(content_tokens(events)) == 3


def test_process_stall_fault_also_stalls_health(sim_url: str) -> None:
    base = sim_url.removesuffix("/v1")
    with httpx.Client(timeout=httpx.Timeout(10, read=0.5)) as client:
        client.put(f"{base}/sim/control/faults", json={"stall_after": 0}).raise_for_status()
        try:
            with pytest.raises(httpx.ReadTimeout):
                client.get(f"{base}/health")
        finally:
            client.post(f"{base}/sim/control/reset").raise_for_status()
        assert client.get(f"{base}/health").json() == {"status": "ok"}


def test_keepalive_fault_sends_comments_after_k_tokens_and_never_finishes(sim_url: str) -> None:
    tokens: list[str] = []
    comments = 0
    # Comments every 0.1 s: a 0.5 s read timeout never fires while they keep coming.
    with httpx.Client(timeout=httpx.Timeout(10, read=0.5)) as client:
        body = {**BODY, "stream": True}
        with client.stream(
            "POST", f"{sim_url}/chat/completions", json=body, headers={"X-Sim-Fault": "keepalive_after=3"}
        ) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    tokens.append(line.removeprefix("data: "))
                elif line == ": keep-alive":
                    comments += 1
                    if comments == 10:  # 1 s of comments, and still no [DONE]
                        break
    assert DONE not in tokens
    assert len(content_tokens(sse_events("".join(f"data: {p}\n\n" for p in tokens)))) == 3
    assert comments == 10


def test_keepalive_fault_on_a_non_stream_request_is_a_stall(sim_url: str) -> None:
    with httpx.Client(timeout=httpx.Timeout(10, read=0.5)) as client, pytest.raises(httpx.ReadTimeout):
        client.post(f"{sim_url}/chat/completions", json=BODY, headers={"X-Sim-Fault": "keepalive_after=2"})


def test_drip_health_fault_starts_a_200_on_health_and_models_and_never_ends_it(sim_url: str) -> None:
    base = sim_url.removesuffix("/v1")
    with httpx.Client(timeout=httpx.Timeout(10, read=0.5)) as client:
        client.put(f"{base}/sim/control/faults", json={"drip_health": True}).raise_for_status()
        try:
            for path in (f"{base}/health", f"{sim_url}/models"):
                received = b""
                with client.stream("GET", path) as response:
                    assert response.status_code == 200
                    assert response.headers["content-type"] == "application/json"
                    for part in response.iter_raw():
                        received += part
                        if len(received) >= 20:  # ~1 s of dripping, and the body is still open
                            break
                assert received.startswith(b'{"status": ')
        finally:
            client.post(f"{base}/sim/control/reset").raise_for_status()
        assert client.get(f"{base}/health").json() == {"status": "ok"}
        assert client.get(f"{sim_url}/models").json()["data"]
