from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

_PREFIX = "sim listening on "


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """A simulated backend on 127.0.0.1 with a free port; yields its …/v1 URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sim", "--port", "0", "--ttft-ms", "1", "--tpot-ms", "1", "--jitter", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith(_PREFIX), f"unexpected first line from the sim: {line!r}"
        url = line.removeprefix(_PREFIX)
        assert url.startswith("http://127.0.0.1:")
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)
