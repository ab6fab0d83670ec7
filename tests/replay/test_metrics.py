"""The metric definitions on hand-made records, SLO and gate parsing, and the per-request client
delay."""

from __future__ import annotations

import asyncio
import time

import pytest

from replay.lag import DelayLimit, LagMonitor, assess
from replay.metrics import Slo, distribution, metric_values, percentile, summarize, weighted_distribution
from replay.record import CANCELLED, LENGTH, RequestRecord, reason_group
from replay.slo import SpecError, judge_gates, parse_duration, parse_gate, parse_slo
from replay.stream import StreamState


def streamed(index: int, output_times: list[float], tokens: int | None = None, **fields: object) -> RequestRecord:
    """A successful streamed record whose E2E ends at the last output chunk."""
    record = RequestRecord(index, f"s{index}", True, start_s=float(index))
    record.output_times_s = output_times
    record.event_times_s = [0.05, *output_times]
    record.ttft_s = output_times[0]
    record.e2e_s = output_times[-1]
    record.output_tokens = tokens if tokens is not None else len(output_times)
    record.ok = True
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def test_ttft_is_the_first_output_chunk_not_the_role_chunk() -> None:
    state = StreamState()
    role = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
    token = b'{"choices":[{"index":0,"delta":{"content":"Hi"}}]}'
    state.on_event(b"", role, 1.0)
    state.on_event(b"", token, 1.2)
    assert state.event_times == [1.0, 1.2]
    assert state.output_times == [1.2]


def test_reasoning_and_tool_call_deltas_count_as_output() -> None:
    state = StreamState()
    state.on_event(b"", b'{"choices":[{"delta":{"reasoning_content":"hmm"}}]}', 1.0)
    state.on_event(b"", b'{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}', 2.0)
    state.on_event(b"", b'{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}', 3.0)
    assert state.output_times == [1.0, 2.0]
    assert state.finish_reason == "tool_calls"
    assert state.tool_args == {0: ["{}"]}


def test_tpot_is_e2e_minus_ttft_over_tokens_after_the_first() -> None:
    record = streamed(0, [0.2, 0.22, 0.24, 0.26], tokens=4)
    assert record.tpot_s == pytest.approx((0.26 - 0.2) / 3)
    assert streamed(1, [0.2], tokens=1).tpot_s is None
    record.stream = False
    assert record.tpot_s is None, "a non-streamed reply has no per-token timing"


def test_usage_tokens_drive_tpot_even_when_chunks_carry_several_tokens() -> None:
    record = streamed(0, [0.2, 0.3], tokens=11)
    assert record.tpot_s == pytest.approx(0.01)


def test_itl_is_every_gap_between_output_chunks() -> None:
    record = streamed(0, [0.2, 0.21, 0.25, 0.25])
    assert record.itl_s == pytest.approx([0.01, 0.04, 0.0])
    other = streamed(1, [0.3, 0.32])
    assert metric_values([record, other], "itl") == pytest.approx([0.01, 0.04, 0.0, 0.02])


def test_percentiles_interpolate_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 90) == pytest.approx(3.7)
    assert distribution([])["p50"] is None
    stats = distribution([3.0, 1.0, 2.0])
    assert (stats["n"], stats["p50"], stats["max"], stats["mean"]) == (3, 2.0, 3.0, 2.0)


def test_goodput_counts_requests_meeting_every_slo_over_all_counted_requests() -> None:
    fast = streamed(0, [0.1, 0.12, 0.14])
    slow_start = streamed(1, [0.9, 0.91, 0.92])
    slow_tokens = streamed(2, [0.1, 0.3, 0.5])
    one_token = streamed(3, [0.1])  # no TPOT: that SLO cannot fail it
    failed = RequestRecord(4, "s4", True, 4.0, reason="http_503")
    cancelled = RequestRecord(5, "s5", True, 5.0, reason=CANCELLED)
    records = [fast, slow_start, slow_tokens, one_token, failed, cancelled]
    summary = summarize(records, wall_s=2.0, slos=[Slo("ttft", 0.8), Slo("tpot", 0.06)])
    assert summary["requests"] == 5
    assert summary["cancelled"] == 1
    assert summary["success_rate"] == pytest.approx(4 / 5)
    assert summary["met_slos"] == 2
    assert summary["goodput"] == pytest.approx(2 / 5)
    assert summary["requests_per_s"] == pytest.approx(2.0)
    assert summary["latency"]["ttft"]["n"] == 4, "latency percentiles cover successful requests only"


def test_failure_table_groups_reasons_with_one_example_and_failure_flag() -> None:
    records = [RequestRecord(i, f"s{i}", True, 0.0, reason="http_503", detail=f"d{i}") for i in range(3)]
    tolerated = RequestRecord(3, "s3", True, 0.0, reason=LENGTH, ok=True, detail="cut")
    rows = summarize([*records, tolerated], 1.0, [])["failures"]
    assert [(r["reason"], r["group"], r["count"], r["is_failure"]) for r in rows] == [
        ("http_503", "5xx", 3, True),
        ("length", "output", 1, False),
    ]
    assert rows[0]["example"] == {"index": 0, "sample_id": "s0", "detail": "d0"}
    assert reason_group("http_429") == "429"
    assert reason_group("http_404") == "4xx"


def test_durations_slos_and_gates_parse() -> None:
    assert parse_duration("800ms") == pytest.approx(0.8)
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("250") == pytest.approx(0.25), "a bare number is milliseconds"
    slo = parse_slo("tpot=60ms")
    assert slo.metric == "tpot"
    assert slo.limit_s == pytest.approx(0.06)
    gate = parse_gate("ttft_p99<=1s")
    assert (gate.name, gate.op, gate.threshold) == ("ttft_p99", "<=", 1.0)
    for bad in ("ttft", "itl=5ms", "ttft=fast"):
        with pytest.raises(SpecError):
            parse_slo(bad)
    for bad in ("speed>=1", "success_rate=1", "goodput>=high"):
        with pytest.raises(SpecError):
            parse_gate(bad)


def test_gates_judge_the_summary_and_a_missing_value_fails() -> None:
    summary = {"success_rate": 0.98, "goodput": None, "latency": {"ttft": {"p99": 0.5}}}
    results = judge_gates(
        [parse_gate("success_rate>=0.99"), parse_gate("ttft_p99<=800ms"), parse_gate("goodput>=0.9")], summary
    )
    assert [(r["value"], r["passed"]) for r in results] == [(0.98, False), (0.5, True), (None, False)]


def monitor_with(ticks: list[tuple[float, float]]) -> LagMonitor:
    monitor = LagMonitor(interval_s=0.001)
    monitor.due = [due for due, _ in ticks]
    monitor.woke = [woke for _, woke in ticks]
    return monitor


def test_client_delay_excludes_only_the_requests_it_affects() -> None:
    # Ticks every ms from 0 to 2 s, on time except one 20 ms stall of the loop at t = 1.0 s.
    ticks, at = [], 0.0
    while at < 2.0:
        woke = at + (0.02 if 1.0 <= at < 1.001 else 0.0002)
        ticks.append((at, woke))
        at = woke + 0.001
    monitor = monitor_with(ticks)
    calm = streamed(0, [0.1, 0.11, 0.12], start_s=0.1, setup_s=0.0, write_delay_s=0.0001)
    # Its first output is read at 1.02 s, as the loop comes back from the stall.
    stalled_read = streamed(1, [0.1, 0.11, 0.12], start_s=0.92, setup_s=0.0, write_delay_s=0.0001)
    slow_write = streamed(2, [0.1, 0.11, 0.12], start_s=0.3, setup_s=0.0, write_delay_s=0.008)
    stall_after_done = streamed(3, [0.1, 0.11, 0.12], start_s=0.85, setup_s=0.0, write_delay_s=0.0001)
    records = [calm, stalled_read, slow_write, stall_after_done]
    assess(records, monitor, origin=0.0, limit=DelayLimit(0.002, 0.03))
    assert [r.timing_ok for r in records] == [True, False, False, True]
    assert stalled_read.client_delay_s == pytest.approx(0.02, abs=0.002)
    assert slow_write.client_delay_s == pytest.approx(0.008)
    summary = summarize(records, wall_s=2.0, slos=[])
    assert summary["timing"]["excluded"] == 2
    assert summary["timing"]["measured"] == 2
    assert summary["latency"]["ttft"]["n"] == 2, "excluded requests leave the latency figures"
    assert summary["succeeded"] == 4, "but they still count as successes"


def test_the_client_delay_limit_grows_with_ttft() -> None:
    limit = DelayLimit(0.002, 0.03)
    assert limit.for_ttft(0.01) == 0.002
    assert limit.for_ttft(1.0) == pytest.approx(0.03)


def test_goodput_does_not_judge_a_request_whose_miss_may_be_the_tools_delay() -> None:
    met = streamed(0, [0.1, 0.2])
    missed = streamed(1, [0.9, 1.0])
    missed_by_the_delay = streamed(2, [0.52, 1.0], timing_ok=False, client_delay_s=0.03)
    missed_beyond_the_delay = streamed(3, [0.9, 1.0], timing_ok=False, client_delay_s=0.03)
    met_under_delay = streamed(4, [0.1, 0.2], timing_ok=False, client_delay_s=0.03)
    records = [met, missed, missed_by_the_delay, missed_beyond_the_delay, met_under_delay]
    summary = summarize(records, wall_s=1.0, slos=[Slo("ttft", 0.5)])
    assert summary["unjudged_slos"] == 1
    assert summary["goodput"] == pytest.approx(2 / 4)


async def test_lag_monitor_sees_a_blocked_event_loop() -> None:
    monitor = LagMonitor(interval_s=0.002)
    monitor.start()
    await asyncio.sleep(0.02)
    time.sleep(0.06)  # noqa: ASYNC251 - blocking the loop is the point, as a CPU-bound callback would
    blocked_to = time.perf_counter()
    await asyncio.sleep(0.01)
    await monitor.stop()
    assert len(monitor.due) >= 5
    assert max(monitor.lateness()) >= 0.05
    assert monitor.stall_at(blocked_to) >= 0.05, "a read right after the block was that late"


def test_token_weighted_percentiles_weight_each_request_by_its_tokens() -> None:
    stats = weighted_distribution([(0.010, 1.0), (0.020, 9.0)])
    assert stats["p50"] == 0.020, "nine tokens in ten came at 20 ms"
    assert stats["mean"] == pytest.approx(0.019)
    records = [streamed(0, [0.1, 0.11], tokens=2), streamed(1, [0.1 + 0.02 * k for k in range(10)], tokens=10)]
    summary = summarize(records, wall_s=1.0, slos=[])
    assert summary["latency"]["tpot"]["p50"] == pytest.approx(0.015), "per request: the midpoint of 10 and 20 ms"
    assert summary["tpot_token_weighted"]["p50"] == pytest.approx(0.02)


def test_a_single_chunk_answer_has_no_tpot_and_says_why() -> None:
    one_chunk = streamed(0, [0.1], tokens=12)
    one_chunk.e2e_s = 0.1001
    assert one_chunk.tpot_s is None
    assert one_chunk.tpot_excluded == "all output arrived in one chunk"
    summary = summarize([one_chunk, streamed(1, [0.1, 0.11, 0.12])], wall_s=1.0, slos=[])
    assert summary["latency"]["tpot"]["n"] == 1
    assert summary["tpot_excluded"] == {"all output arrived in one chunk": 1}


def test_length_cut_off_streams_count_for_latency_and_get_their_own_column() -> None:
    cut = [streamed(n, [0.1, 0.11, 0.12], finish_reason="length") for n in range(3)]
    for record in cut:
        record.ok, record.reason = False, LENGTH
    summary = summarize([*cut, streamed(3, [0.1, 0.11])], wall_s=1.0, slos=[])
    assert summary["latency"]["ttft"]["n"] == 4
    assert summary["length_cutoffs"] == 3
    assert summary["succeeded"] == 1
