"""Load shapes: arrivals, caps and the count and time bounds (httpx.MockTransport, no network)."""

from __future__ import annotations

import asyncio
import io
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from replay.client import ClientConfig
from replay.runner import Counts, LoadPlan, Progress, arrival_offsets, order_for_plan
from replay.samples import Overrides
from replay.session import RunOptions, replay
from tests.replay.conftest import chat_body, write_jsonl

STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)


class CountingBackend:
    """A mock endpoint that answers after `delay_s` and tracks how many requests overlap."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.in_flight = 0
        self.peak = 0
        self.arrivals: list[float] = []

    async def _body(self) -> AsyncIterator[bytes]:
        try:
            await asyncio.sleep(self.delay_s)
            yield STREAM
        finally:
            self.in_flight -= 1

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.arrivals.append(time.perf_counter())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._body())


def _options(samples: Path, plan: LoadPlan) -> RunOptions:
    client = ClientConfig("http://127.0.0.1:9/v1", first_token_timeout_s=5, stall_timeout_s=5, request_timeout_s=10)
    return RunOptions(samples, client, plan, Overrides(stream=True))


def test_poisson_arrivals_are_seeded_and_average_the_rate() -> None:
    plan = LoadPlan(mode="rate", rate=50.0, count=2000, seed=7)
    first = arrival_offsets(plan, [])
    assert first == arrival_offsets(plan, []), "the same seed gives the same arrivals"
    assert first != arrival_offsets(LoadPlan(mode="rate", rate=50.0, count=2000, seed=8), [])
    assert first is not None
    assert first[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(first)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(1 / 50, rel=0.15), "exponential gaps: stdev equals the mean"


def test_original_timing_follows_timestamps_scaled_and_goes_through_once() -> None:
    plan = LoadPlan(mode="original", time_scale=0.5, count=3)
    timestamps = [105.0, 100.0, 101.0]
    order = order_for_plan(plan, timestamps)
    assert order == [1, 2, 0]
    assert arrival_offsets(plan, [timestamps[i] for i in order]) == [0.0, 0.5, 2.5]
    with pytest.raises(ValueError, match="timestamp"):
        arrival_offsets(plan, [1.0, None, 2.0])


def test_closed_loop_cycles_samples_up_to_the_count() -> None:
    order = order_for_plan(LoadPlan(count=7), [None] * 3)
    assert order == [0, 1, 2, 0, 1, 2, 0]


async def test_closed_loop_keeps_exactly_the_concurrency_in_flight(tmp_path: Path) -> None:
    samples = write_jsonl(tmp_path / "s.jsonl", [chat_body(n) for n in range(4)])
    backend = CountingBackend(delay_s=0.05)
    document = await replay(_options(samples, LoadPlan(concurrency=5, count=20)), httpx.MockTransport(backend))
    assert backend.peak == 5
    assert document["summary"]["succeeded"] == 20
    assert [r["sample_id"] for r in document["records"][:5]] == ["line-1", "line-2", "line-3", "line-4", "line-1"]


async def test_rate_mode_sends_on_the_poisson_schedule(tmp_path: Path) -> None:
    samples = write_jsonl(tmp_path / "s.jsonl", [chat_body(0)])
    plan = LoadPlan(mode="rate", rate=40.0, count=12, concurrency=64, seed=3)
    document = await replay(_options(samples, plan), httpx.MockTransport(CountingBackend(delay_s=0.01)))
    due = arrival_offsets(plan, [])
    assert due is not None
    # How late each request actually left depends on the machine's load; what the tool guarantees is
    # that it waits for each due time and records the lateness against exactly that schedule.
    for record, offset in zip(document["records"], due, strict=True):
        assert record["start_s"] >= offset
        assert record["start_s"] - record["dispatch_late_s"] == pytest.approx(offset, abs=1e-9)


async def test_duration_and_drain_bound_the_run_and_cancelled_requests_are_not_counted(tmp_path: Path) -> None:
    samples = write_jsonl(tmp_path / "s.jsonl", [chat_body(0)])
    plan = LoadPlan(concurrency=3, count=1000, duration_s=0.3, drain_s=0.2)
    started = time.perf_counter()
    document = await replay(_options(samples, plan), httpx.MockTransport(CountingBackend(delay_s=30.0)))
    # What is bounded is the wait for a backend that takes 30 s: half of that leaves any loaded
    # machine its time, and still proves the run did not wait for the answers.
    assert time.perf_counter() - started < 15.0
    summary = document["summary"]
    assert (summary["cancelled"], summary["requests"], summary["success_rate"]) == (3, 0, None)
    assert {r["reason"] for r in document["records"]} == {"cancelled"}


async def test_the_run_stops_dispatching_at_the_duration(tmp_path: Path) -> None:
    samples = write_jsonl(tmp_path / "s.jsonl", [chat_body(0)])
    plan = LoadPlan(concurrency=2, count=1000, duration_s=0.3, drain_s=1.0)
    document = await replay(_options(samples, plan), httpx.MockTransport(CountingBackend(delay_s=0.05)))
    # At most 2 in flight, each taking at least 50 ms, for 0.3 s: never more than 14. How many fewer
    # depends on the machine's load; the first one always leaves.
    assert 1 <= document["summary"]["succeeded"] <= 14
    assert document["run"]["dispatched"] == len(document["records"])


def test_the_progress_line_reports_counts_and_logs_plain_lines() -> None:
    counts = Counts(sent=12, done=9, failed=2)
    log = io.StringIO()
    progress = Progress(40, counts, log)
    assert "sent 12/40" in progress.line()
    assert "done 9  failed 2  in flight 3" in progress.line()
    progress.close()
    assert log.getvalue().endswith("req/s\n"), "not a terminal: whole lines, no carriage returns"
    assert "\r" not in log.getvalue()


async def test_a_bug_in_the_tool_fails_the_run_instead_of_losing_records(tmp_path: Path) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("not a server failure: a bug")

    samples = write_jsonl(tmp_path / "s.jsonl", [chat_body(0)])
    with pytest.raises(RuntimeError, match="a bug"):
        await replay(_options(samples, LoadPlan(concurrency=2, count=4)), httpx.MockTransport(broken))
