"""`gateway replay` cross-checked against an independent client and against the server's own stamps.

Both clients replay the same samples against the same sim (TTFT 100 ms, TPOT 10 ms, no jitter),
which stamps when it had each whole request and when it wrote its first output bytes (see
stamping_sim.py). Two properties hold whatever the load on the machine:

- a client's TTFT for a request can never be below the server's receive-to-first-byte time for it,
  because the client's clock starts before the request is written and stops after the bytes are
  read; a figure below it means the clock started late (the defect this file was written for);
- what each client adds on top of the server's own figure (loopback, its own scheduling) is
  measured per request in the same run, so comparing the two clients' medians of that excess
  compares the clients and not the machine's load at the time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from replay.client import ClientConfig
from replay.runner import LoadPlan
from replay.samples import Overrides
from replay.session import RunOptions, replay, run_blocking
from tests.replay.conftest import chat_body, running_sim, write_jsonl
from tests.replay.reference_client import Measured, run_reference

TTFT_MS, TPOT_MS, MAX_TOKENS = 100, 10, 20
# The tolerance between the two clients: max(2 ms, 3% of TTFT).
TOLERANCE_S = max(0.002, 0.03 * TTFT_MS / 1000)
COUNTS = {1: 24, 16: 160}


@pytest.fixture(scope="module")
def stamping_sim() -> Iterator[str]:
    options = ("--ttft-ms", str(TTFT_MS), "--tpot-ms", str(TPOT_MS), "--jitter", "0")
    with running_sim(*options, module="tests.replay.stamping_sim") as url:
        yield url


def server_stamps(url: str) -> dict[str, float]:
    """Receive-to-first-byte per request key since the last call (the sim forgets them)."""
    root = url.removesuffix("/v1")
    stamps = httpx.get(f"{root}/_stamps", timeout=10).json()
    return {stamp["key"]: stamp["first"] - stamp["received"] for stamp in stamps}


def samples(tmp_path: Path, concurrency: int) -> tuple[Path, list[tuple[str, bytes]]]:
    items = [
        {"id": f"c{concurrency}-{n}", **chat_body(n + 1000 * concurrency, stream=True, max_tokens=MAX_TOKENS)}
        for n in range(COUNTS[concurrency])
    ]
    path = write_jsonl(tmp_path / f"crosscheck-{concurrency}.jsonl", items)
    bodies = []
    for item in items:
        body = {k: v for k, v in item.items() if k != "id"}
        body["stream_options"] = {"include_usage": True}
        bodies.append((item["messages"][-1]["content"], orjson.dumps(body)))
    return path, bodies


def replay_run(url: str, path: Path, concurrency: int) -> dict[str, Any]:
    options = RunOptions(path, ClientConfig(url), LoadPlan(concurrency=concurrency, count=COUNTS[concurrency]),
                         Overrides(max_tokens=MAX_TOKENS))  # fmt: skip
    return run_blocking(replay(options))


def summary(name: str, ttft: list[float], tpot: list[float], excess: list[float]) -> str:
    return (
        f"{name:<10} TTFT p50 {statistics.median(ttft) * 1000:8.2f} ms  min {min(ttft) * 1000:8.2f} ms  "
        f"max {max(ttft) * 1000:8.2f} ms  TPOT p50 {statistics.median(tpot) * 1000:6.2f} ms  "
        f"excess over server p50 {statistics.median(excess) * 1000:6.2f} ms"
    )


@pytest.mark.parametrize("concurrency", [1, 16])
def test_replay_ttft_is_never_below_the_server_and_matches_a_reference_client(
    stamping_sim: str, tmp_path: Path, concurrency: int
) -> None:
    path, bodies = samples(tmp_path, concurrency)
    server_stamps(stamping_sim)  # forget anything earlier

    reference: list[Measured] = run_reference(stamping_sim, bodies, concurrency, timeout_s=120)
    server_ref = server_stamps(stamping_sim)
    document = replay_run(stamping_sim, path, concurrency)
    server_replay = server_stamps(stamping_sim)

    key_of = {f"c{concurrency}-{n}": key for n, (key, _) in enumerate(bodies)}
    records = document["records"]
    assert [r["ok"] for r in records] == [True] * COUNTS[concurrency], document["summary"]["failures"]
    assert all(m.ttft_s is not None and m.tokens == MAX_TOKENS for m in reference)

    replay_ttft = {key_of[r["sample_id"]]: r["ttft_s"] for r in records}
    below = {k: (v, server_replay[k]) for k, v in replay_ttft.items() if v < server_replay[k]}
    assert not below, f"replay TTFT below the server's receive-to-first-byte time: {below}"
    ref_ttft = {m.key: m.ttft_s for m in reference if m.ttft_s is not None}
    assert all(v >= server_ref[k] for k, v in ref_ttft.items()), "the reference client's clock is wrong"

    replay_excess = [v - server_replay[k] for k, v in replay_ttft.items()]
    ref_excess = [v - server_ref[k] for k, v in ref_ttft.items()]
    replay_tpot = [r["tpot_s"] for r in records]
    ref_tpot = [m.tpot_s for m in reference if m.tpot_s is not None]
    print(f"\nconcurrency {concurrency}, {COUNTS[concurrency]} requests")
    print(summary("replay", list(replay_ttft.values()), replay_tpot, replay_excess))
    print(summary("reference", list(ref_ttft.values()), ref_tpot, ref_excess))
    print(f"server    receive-to-first-byte p50 {statistics.median(server_replay.values()) * 1000:.2f} ms")
    print(f"replay excluded for its own delay: {document['summary']['timing']['excluded']}")
    difference = statistics.median(replay_excess) - statistics.median(ref_excess)
    assert abs(difference) <= TOLERANCE_S, (
        f"replay's TTFT p50 over the server's own differs from the reference client's by {difference * 1000:.2f} ms"
    )
