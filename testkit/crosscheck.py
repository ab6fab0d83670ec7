"""The replay cross-check: `gateway replay` and an independent reference client
(testkit/reference_client.py) replay the same samples against the same stamping sim
(testkit/stamping_sim.py) at once, each client's TTFT compared with the server's own
receive-to-first-byte time for the same request. tests/replay/test_reference_crosscheck.py
asserts on it, bench/replay_crosscheck.py prints it."""

from __future__ import annotations

import contextlib
import os
import select
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from replay.client import ClientConfig
from replay.runner import LoadPlan
from replay.samples import Overrides
from replay.session import RunOptions, replay, run_blocking
from testkit.reference_client import Measured

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_PREFIX = "sim listening on "
STAMPING_SIM = "testkit.stamping_sim"


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


def chat_body(n: int, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": f"Tell me story {n}."}], **extra}


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(item) + b"\n" for item in items))
    return path


TTFT_MS, TPOT_MS, MAX_TOKENS = 100, 10, 20
# The tolerance between the two clients: max(2 ms, 3% of TTFT).
TOLERANCE_S = max(0.002, 0.03 * TTFT_MS / 1000)
COUNTS = {1: 24, 16: 160}
SIM_OPTIONS = ("--ttft-ms", str(TTFT_MS), "--tpot-ms", str(TPOT_MS), "--jitter", "0")


def server_figures(url: str) -> dict[str, float]:
    """Receive-to-first-byte per request key since the last call (the sim forgets them)."""
    stamps = httpx.get(f"{url.removesuffix('/v1')}/_stamps", timeout=10).json()
    return {stamp["key"]: stamp["first"] - stamp["received"] for stamp in stamps}


def samples(tmp_path: Path, concurrency: int, client: str) -> tuple[Path, list[tuple[str, bytes]]]:
    """The same requests for either client, told apart by the server through their text."""
    items = []
    for n in range(COUNTS[concurrency]):
        item = {"id": f"{client}-{n}", **chat_body(n, stream=True, max_tokens=MAX_TOKENS)}
        item["messages"][-1]["content"] += f" ({client} c{concurrency})"
        items.append(item)
    path = write_jsonl(tmp_path / f"crosscheck-{concurrency}-{client}.jsonl", items)
    bodies = []
    for item in items:
        body = {k: v for k, v in item.items() if k != "id"}
        body["stream_options"] = {"include_usage": True}
        bodies.append((item["messages"][-1]["content"], orjson.dumps(body)))
    return path, bodies


def start_reference(
    url: str, bodies: list[tuple[str, bytes]], concurrency: int, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    source, out = tmp_path / f"reference-{concurrency}.json", tmp_path / f"reference-{concurrency}-out.json"
    source.write_bytes(orjson.dumps([(key, body.decode()) for key, body in bodies]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "testkit.reference_client", url, str(source), str(concurrency), str(out)]
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env), out


def finish_reference(process: subprocess.Popen[bytes], out: Path) -> list[Measured]:
    try:
        assert process.wait(timeout=150) == 0, "the reference client failed"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    return [Measured(**item) for item in orjson.loads(out.read_bytes())]


@dataclass(frozen=True, slots=True)
class Client:
    """One client's per-request figures against the server's own for the same requests."""

    ttft: dict[str, float]
    tpot: list[float]
    server: dict[str, float]

    @property
    def excess(self) -> list[float]:
        return [value - self.server[key] for key, value in self.ttft.items()]

    def below_server(self) -> dict[str, tuple[float, float]]:
        return {k: (v, self.server[k]) for k, v in self.ttft.items() if v < self.server[k]}

    def line(self, name: str) -> str:
        ttft = list(self.ttft.values())
        return (
            f"{name:<10} TTFT p50 {statistics.median(ttft) * 1000:7.2f} ms  min {min(ttft) * 1000:7.2f} ms  "
            f"max {max(ttft) * 1000:7.2f} ms  TPOT p50 {statistics.median(self.tpot) * 1000:6.2f} ms  "
            f"over the server's own p50 {statistics.median(self.excess) * 1000:5.2f} ms  "
            f"(server p50 {statistics.median(self.server.values()) * 1000:.2f} ms)"
        )


def crosscheck(url: str, tmp_path: Path, concurrency: int) -> tuple[Client, Client, dict[str, Any]]:
    """Run both clients at once at `concurrency`; (replay, reference, replay's result document)."""
    path, replay_bodies = samples(tmp_path, concurrency, "replay")
    _, bodies = samples(tmp_path, concurrency, "reference")
    server_figures(url)  # forget anything earlier
    process, out = start_reference(url, bodies, concurrency, tmp_path)
    try:
        options = RunOptions(
            path,
            ClientConfig(url),
            LoadPlan(concurrency=concurrency, count=COUNTS[concurrency]),
            Overrides(max_tokens=MAX_TOKENS),
        )
        document = run_blocking(replay(options))
    finally:
        reference = finish_reference(process, out)
    server = server_figures(url)
    records = document["records"]
    assert [r["ok"] for r in records] == [True] * COUNTS[concurrency], document["summary"]["failures"]
    assert all(m.ttft_s is not None and m.tokens == MAX_TOKENS for m in reference)
    key_of = {f"replay-{n}": key for n, (key, _) in enumerate(replay_bodies)}
    replay_ttft = {key_of[r["sample_id"]]: r["ttft_s"] for r in records}
    ref_ttft = {m.key: m.ttft_s for m in reference if m.ttft_s is not None}
    return (
        Client(replay_ttft, [r["tpot_s"] for r in records], {k: server[k] for k in replay_ttft}),
        Client(ref_ttft, [m.tpot_s for m in reference if m.tpot_s is not None], {k: server[k] for k in ref_ttft}),
        document,
    )
