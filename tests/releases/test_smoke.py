"""The release smoke gate judges what was measured about the release, never the measuring process,
and its refusal names the real reason."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.releases.smoke import run_smoke, smoke_verdict
from replay.metrics import Slo, summarize
from replay.record import RequestRecord
from replay.report import result_document
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


def smoke(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    samples = write_jsonl(tmp_path / "smoke.jsonl", [chat_body(n) for n in range(4)])
    return {"samples": str(samples), "count": 4, "min_goodput": 1.0, **fields}


def test_the_smoke_run_against_a_real_server_passes_and_refuses_for_the_real_reason(sim: str, tmp_path: Path) -> None:
    assert asyncio.run(run_smoke(smoke(tmp_path, slo_ttft_ms=5000), sim, "", "sim-model")) is None
    refused = asyncio.run(run_smoke(smoke(tmp_path, slo_ttft_ms=0.001), sim, "", "sim-model"))
    assert refused is not None
    assert refused.startswith("goodput 0.00 below the required 1: 4 of 4 requests missed ttft<=0.001ms"), refused


def test_a_smoke_run_that_cannot_start_says_why(tmp_path: Path) -> None:
    broken = smoke(tmp_path)
    broken["samples"] = str(tmp_path / "missing.jsonl")
    refused = asyncio.run(run_smoke(broken, "http://127.0.0.1:9/v1", "", "sim-model"))
    assert refused is not None
    assert refused.startswith("the replay did not run (exit 2)")
    assert "missing.jsonl" in refused
