"""Fixtures for the replay tests: simulated backends as real processes on 127.0.0.1, sample files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.crosscheck import REPO_ROOT, STAMPING_SIM, chat_body, running_sim, write_jsonl

__all__ = ["REPO_ROOT", "chat_body", "running_sim", "write_jsonl"]  # the replay tests import them from here

SHARED_SAMPLES = REPO_ROOT.parent / "shared" / "samples"


@pytest.fixture(scope="module")
def paced_sim() -> Iterator[str]:
    """The sim the accuracy checks compare against (TTFT 200 ms, TPOT 20 ms), behind the wrapper
    that stamps what the server saw of each request (testkit/stamping_sim.py)."""
    options = ("--ttft-ms", "200", "--tpot-ms", "20", "--jitter", "0.1")
    with running_sim(*options, module=STAMPING_SIM) as url:
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


@pytest.fixture
def simple_samples(tmp_path: Path) -> Path:
    """Ten plain streaming chat requests in our JSONL format."""
    return write_jsonl(tmp_path / "simple.jsonl", [{"id": f"s{n}", **chat_body(n, stream=True)} for n in range(10)])
