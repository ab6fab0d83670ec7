"""Replay through the gateway and directly at the backend in one run: the difference is the
gateway's added TTFT, and it is small."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from testkit.procs import deployment, gateway_config, running_gateway, start_sim


def replay(samples: Path, base_url: str, key: str, out: Path) -> dict[str, Any]:
    # A sanity bound on the gateway's overhead, not a measurement: keep every request in the figures
    # even when the replay tool's own delay on a busy machine would exclude it (--max-lag in ms).
    command = [
        sys.executable, "-m", "gateway", "replay", "run", str(samples), "--base-url", base_url, "--api-key", key,
        "--model", "sim-model", "--max-tokens", "8", "--concurrency", "2", "--length-ok", "--max-lag", "60000",
        "--quiet", "--out", str(out),
    ]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return dict(json.loads(out.read_text()))


@pytest.mark.timing
def test_gateway_adds_little_ttft_over_direct(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    lines = [{"id": f"s{i}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(30)]
    samples.write_bytes(b"\n".join(orjson.dumps(line) for line in lines))
    sim = start_sim("--ttft-ms", "40", "--tpot-ms", "5")
    try:
        with running_gateway(tmp_path, gateway_config(deployment("a", sim))) as gateway:
            through = replay(samples, f"{gateway.url}/v1", gateway.key, tmp_path / "gateway.json")
            direct = replay(samples, f"{sim.url}/v1", "unused", tmp_path / "direct.json")
    finally:
        sim.stop()
    assert through["summary"]["success_rate"] == 1.0
    assert direct["summary"]["success_rate"] == 1.0
    added_ttft_s = through["summary"]["latency"]["ttft"]["p50"] - direct["summary"]["latency"]["ttft"]["p50"]
    assert direct["summary"]["latency"]["ttft"]["p50"] >= 0.040
    # A sanity bound, not a performance claim (bench/overhead.py measures that).
    assert -0.010 < added_ttft_s < 0.5, f"gateway added {added_ttft_s * 1000:.1f} ms of TTFT"
