"""`gateway serve --workers N`: workers are replicas sharing one port, so on Redis quotas and
sessions stay exact across them; the embedded store (in-process quota counters) refuses N > 1;
a worker that dies is replaced, and none outlives the supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from common.processes import Announced
from testkit.procs import (
    GatewayProcess,
    delete_redis_prefix,
    deployment,
    gateway_config,
    gateway_process,
    redis_store_config,
)
from tests.e2e.test_sessions import BODY, expected_text, read_then_drop, resume, text_of


def workers_of(supervisor: int) -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{supervisor}/task").iterdir():
        pids |= {int(pid) for pid in (task / "children").read_text().split()}
    return pids


def alive(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return False


def wait_for(condition: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two_workers(slow_sim: Announced, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(deployment("a", slow_sim), store=redis_store_config(prefix))
    try:
        with gateway_process(tmp_path_factory.mktemp("workers"), config, args=("--workers", "2")) as gateway:
            assert len(workers_of(gateway.process.process.pid)) == 2
            yield gateway
    finally:
        delete_redis_prefix(prefix)


def test_the_embedded_store_refuses_several_workers(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(gateway_config({"name": "a", "api_base": "http://127.0.0.1:9/v1", "model": "m"})))
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "--workers 2 needs the redis store" in done.stderr


def test_a_quota_is_exact_across_workers(two_workers: GatewayProcess) -> None:
    limit = 12
    _, key = two_workers.create_key(rpm=limit)
    body = {**BODY, "stream": False, "max_tokens": 2}

    def one(_: int) -> int:
        # A new connection per request: the kernel gives each to whichever worker accepts first.
        reply = httpx.post(
            f"{two_workers.url}/v1/chat/completions", json=body, headers=two_workers.headers(key), timeout=30
        )
        return reply.status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(one, range(3 * limit)))
    assert sorted(set(statuses)) == [200, 429]
    assert statuses.count(200) == limit


def test_sessions_resume_on_any_worker(two_workers: GatewayProcess, slow_sim: Announced) -> None:
    # Each resume is a new connection, so it may reach the other worker, which follows the first's
    # checkpoints; either way the client gets every event once.
    for keep in (2, 5, 9, 14):
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        first = read_then_drop(two_workers, session_id, keep)
        rest = resume(two_workers, session_id, first[-1][0])
        ids = [seq for seq, _ in first + rest]
        assert ids == list(range(1, len(ids) + 1))
        assert rest[-1][1] == "[DONE]"
        assert text_of(first + rest) == expected_text(slow_sim)
        whole = httpx.get(
            f"{two_workers.url}/v1/sessions/{session_id}", headers=two_workers.headers(), timeout=10
        ).json()
        assert whole["id"] == session_id


def test_a_dead_worker_is_replaced_and_none_outlives_the_supervisor(slow_sim: Announced, tmp_path: Path) -> None:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(deployment("a", slow_sim), store=redis_store_config(prefix))
    try:
        with gateway_process(tmp_path, config, args=("--workers", "2")) as gateway:
            supervisor = gateway.process.process.pid
            before = workers_of(supervisor)
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: len(workers_of(supervisor)) == 2 and victim not in workers_of(supervisor), "a new worker")
            workers = workers_of(supervisor)
            body = {**BODY, "stream": False, "max_tokens": 2}
            # The replacement accepts too: keep asking, on new connections, until both have answered.
            for _ in range(20):
                reply = httpx.post(
                    f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=30
                )
                assert reply.status_code == 200
        wait_for(lambda: not any(alive(pid) for pid in workers), "the workers to stop with the supervisor")
    finally:
        delete_redis_prefix(prefix)
