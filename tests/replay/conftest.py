"""Fixtures for the replay tests: simulated backends as real processes on 127.0.0.1, sample files."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_SAMPLES = REPO_ROOT.parent / "shared" / "samples"
READY_PREFIX = "sim listening on "


@contextlib.contextmanager
def running_sim(*options: str, module: str = "sim") -> Iterator[str]:
    """Start `python -m sim --port 0 ...` (or the stamping wrapper), yield its base URL,
    always stop it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    where = ("--host", "127.0.0.1", "--port", "0") if module == "sim" else ()
    command = [sys.executable, "-m", module, *where, *options]
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 30)
        assert readable, "the sim did not print its ready line within 30 s"
        line = proc.stdout.readline()
        assert line.startswith(READY_PREFIX), line
        url = line.removeprefix(READY_PREFIX).strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def paced_sim() -> Iterator[str]:
    """The sim the accuracy checks compare against (TTFT 200 ms, TPOT 20 ms), behind the wrapper
    that stamps what the server saw of each request (tests/replay/stamping_sim.py)."""
    options = ("--ttft-ms", "200", "--tpot-ms", "20", "--jitter", "0.1")
    with running_sim(*options, module="tests.replay.stamping_sim") as url:
        yield url


def server_stamps(url: str) -> dict[str, dict[str, float]]:
    """The stamping sim's stamps per request key since the last call (it forgets them)."""
    stamps = httpx.get(f"{url.removesuffix('/v1')}/_stamps", timeout=10).json()
    return {stamp["key"]: stamp for stamp in stamps}


def unique_samples(path: Path, count: int, **extra: Any) -> Path:
    """`count` streaming samples whose last message differs, so server stamps map to requests."""
    return write_jsonl(path, [{"id": f"u{n}", **chat_body(n, stream=True, **extra)} for n in range(count)])


@pytest.fixture(scope="module")
def fast_sim() -> Iterator[str]:
    """A quick sim for fault and CLI tests, where timing is not what is checked."""
    with running_sim("--ttft-ms", "5", "--tpot-ms", "2", "--jitter", "0") as url:
        yield url


def chat_body(n: int, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": f"Tell me story {n}."}], **extra}


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(item) + b"\n" for item in items))
    return path


@pytest.fixture
def simple_samples(tmp_path: Path) -> Path:
    """Ten plain streaming chat requests in our JSONL format."""
    return write_jsonl(tmp_path / "simple.jsonl", [{"id": f"s{n}", **chat_body(n, stream=True)} for n in range(10)])
