"""Comparing runs: verdicts separate real regressions from noise, and the CLI exit code follows."""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gateway.cli.replay import replay_group
from replay.compare import compare_results, median_difference_ci, resampled_median
from replay.metrics import Slo, percentile, summarize
from replay.record import RequestRecord
from replay.report import result_document, write_result

WORKLOAD = {"samples_sha256": "a" * 64, "settings_sha256": "b" * 64}


def synthetic_run(
    ttft_ms: float,
    spread_ms: float,
    n: int = 200,
    seed: int = 1,
    failures: int = 0,
    workload: dict[str, str] = WORKLOAD,
) -> dict[str, Any]:
    """A result document whose streams have the given TTFT distribution and 20 tokens at ~20 ms."""
    draw = random.Random(seed)
    records = []
    for index in range(n):
        record = RequestRecord(index, f"s{index}", True, start_s=index * 0.01, setup_s=0.001, status=200)
        if index < failures:
            record.reason, record.detail = "http_503", "HTTP 503"
            records.append(record)
            continue
        ttft = max(0.001, draw.gauss(ttft_ms, spread_ms) / 1000)
        record.output_times_s = [ttft + k * draw.uniform(0.018, 0.022) for k in range(20)]
        record.event_times_s = list(record.output_times_s)
        record.ttft_s, record.e2e_s = ttft, record.output_times_s[-1]
        record.output_tokens, record.tokens_source, record.ok = 20, "usage", True
        records.append(record)
    summary = summarize(records, wall_s=n * 0.01, slos=[Slo("ttft", 0.8)])
    run = {"shape": "synthetic", "samples": "s.jsonl", "workload": workload, "plan": {"count": n}}
    return result_document(run=run, records=records, summary=summary, gates=[], problems=[])


def verdicts_by_metric(base: dict[str, Any], candidate: dict[str, Any], **options: Any) -> dict[str, str]:
    return {v.metric: v.verdict for v in compare_results(base, candidate, **options)}


def test_the_constant_time_bootstrap_median_matches_brute_force_resampling() -> None:
    draw = random.Random(5)
    for n in (7, 8):
        sample = sorted(draw.expovariate(1.0) for _ in range(n))
        fast = sorted(resampled_median(sample, random.Random(11 + i)) for i in range(4000))
        slow = sorted(statistics.median(draw.choices(sample, k=n)) for _ in range(4000))
        for q in (10, 25, 50, 75, 90):
            assert percentile(fast, q) == pytest.approx(percentile(slow, q), abs=0.08), (n, q)


def test_identical_runs_show_no_regression() -> None:
    run = synthetic_run(200, 20)
    verdicts = compare_results(run, run)
    assert not any(v.regression for v in verdicts)
    assert {v.metric: v.verdict for v in verdicts}["TTFT p50"] == "no significant change"


def test_a_clearly_slower_candidate_is_a_ttft_regression() -> None:
    verdicts = verdicts_by_metric(synthetic_run(200, 20, seed=1), synthetic_run(260, 20, seed=2))
    assert verdicts["TTFT p50"] == "REGRESSION"
    assert verdicts["TPOT p50"] == "no significant change"


def test_a_large_change_within_the_noise_is_not_a_regression() -> None:
    verdicts = verdicts_by_metric(synthetic_run(200, 150, n=6, seed=1), synthetic_run(240, 150, n=6, seed=2))
    assert verdicts["TTFT p50"] == "no significant change"


def test_a_significant_change_below_the_threshold_is_not_a_regression() -> None:
    verdicts = verdicts_by_metric(synthetic_run(200, 2, seed=1), synthetic_run(206, 2, seed=2))
    assert verdicts["TTFT p50"].startswith("changed, within")


def test_a_drop_in_success_rate_beyond_the_rate_threshold_is_a_regression() -> None:
    verdicts = verdicts_by_metric(synthetic_run(200, 20), synthetic_run(200, 20, failures=20))
    assert verdicts["success rate"] == "REGRESSION"
    assert verdicts["goodput"] == "REGRESSION"


def test_the_bootstrap_interval_is_reproducible_with_its_seed() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 5.0, 6.0]
    assert median_difference_ci(a, b, 500, 0.95, seed=3) == median_difference_ci(a, b, 500, 0.95, seed=3)


def test_compare_command_exits_non_zero_only_on_a_regression(tmp_path: Path) -> None:
    base, same, slower = tmp_path / "base.json", tmp_path / "same.json", tmp_path / "slower.json"
    write_result(base, synthetic_run(200, 20, seed=1))
    write_result(same, synthetic_run(200, 20, seed=1))
    write_result(slower, synthetic_run(260, 20, seed=2))
    runner = CliRunner()
    calm = runner.invoke(replay_group, ["compare", str(base), str(same)])
    assert calm.exit_code == 0, calm.output
    assert "verdict: no regression" in calm.output
    worse = runner.invoke(replay_group, ["compare", str(base), str(slower), "--threshold", "0.1"])
    assert worse.exit_code == 1, worse.output
    assert "REGRESSION in TTFT p50" in worse.output
    tolerant = runner.invoke(replay_group, ["compare", str(base), str(slower), "--threshold", "0.5"])
    assert tolerant.exit_code == 0, tolerant.output


def test_compare_refuses_a_file_that_is_not_a_result(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.json"
    bogus.write_text("{}")
    result = CliRunner().invoke(replay_group, ["compare", str(bogus), str(bogus)])
    assert result.exit_code == 2
    assert "not a replay result" in result.output


def test_compare_refuses_runs_of_different_workloads_unless_told(tmp_path: Path) -> None:
    base, other, settings = tmp_path / "base.json", tmp_path / "other.json", tmp_path / "settings.json"
    write_result(base, synthetic_run(200, 20, seed=1))
    write_result(other, synthetic_run(260, 20, seed=2, workload={**WORKLOAD, "samples_sha256": "c" * 64}))
    write_result(settings, synthetic_run(200, 20, seed=2, n=100, workload={**WORKLOAD, "settings_sha256": "d" * 64}))
    runner = CliRunner()
    refused = runner.invoke(replay_group, ["compare", str(base), str(other)])
    assert refused.exit_code == 2, refused.output
    assert "different sample files" in refused.output
    differs = runner.invoke(replay_group, ["compare", str(base), str(settings)])
    assert differs.exit_code == 2, differs.output
    assert "different settings (plan differ)" in differs.output
    anyway = runner.invoke(replay_group, ["compare", str(base), str(other), "--allow-different-workload"])
    assert anyway.exit_code == 1, anyway.output
    assert "WARNING: the runs replayed different sample files" in anyway.output
    assert "REGRESSION in TTFT p50" in anyway.output


def test_a_run_records_the_digest_of_its_samples_and_settings(fast_sim: str, simple_samples: Path) -> None:
    from replay.client import ClientConfig
    from replay.runner import LoadPlan
    from replay.samples import Overrides
    from replay.session import RunOptions, replay, run_blocking

    def digest(count: int) -> dict[str, str]:
        options = RunOptions(simple_samples, ClientConfig(fast_sim), LoadPlan(count=count), Overrides(max_tokens=3))
        document: dict[str, Any] = run_blocking(replay(options))
        workload: dict[str, str] = document["run"]["workload"]
        return workload

    first, again, more = digest(2), digest(2), digest(3)
    assert first == again
    assert first["samples_sha256"] == more["samples_sha256"]
    assert first["settings_sha256"] != more["settings_sha256"]
