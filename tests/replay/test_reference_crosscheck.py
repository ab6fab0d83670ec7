"""`gateway replay` cross-checked against an independent client and against the server's own stamps.

Both clients replay the same samples against the same sim (TTFT 100 ms, TPOT 10 ms, no jitter) at
the same time (the reference in a process of its own, testkit/reference_client.py), and the
sim stamps when it had each whole request and when it wrote its first output bytes
(stamping_sim.py).

- Whatever the load on the machine, a client's TTFT for a request can never be below the server's
  receive-to-first-byte time for it: its clock starts before the request is written and stops after
  the bytes are read. A figure below it means the clock started late, the defect this was written
  for. Checked per request, for both clients, at concurrency 1 and 16.
- What each client adds on top of the server's own figure (the server picking the request up,
  loopback, the client's own scheduling) is measured per request in the same time window, so
  comparing the two clients' medians of that excess compares the clients, not the moments they ran
  at. At concurrency 1 replay must be within max(2 ms, 3% of TTFT) of the reference. At 16 streams
  on this shared 2-core machine neither client holds that margin run to run (the reference's own
  median excess was seen anywhere from 0.5 to 13 ms), so that comparison is a wall-clock figure and
  lives in bench/replay_crosscheck.py, which prints both clients side by side.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.crosscheck import COUNTS, SIM_OPTIONS, STAMPING_SIM, TOLERANCE_S, crosscheck, running_sim


@pytest.fixture(scope="module")
def stamping_sim() -> Iterator[str]:
    with running_sim(*SIM_OPTIONS, module=STAMPING_SIM) as url:
        yield url


@pytest.mark.timing
@pytest.mark.parametrize("concurrency", [1, 16])
def test_no_client_ever_reads_a_ttft_below_the_servers_own(stamping_sim: str, tmp_path: Path, concurrency: int) -> None:
    replayed, reference, document = crosscheck(stamping_sim, tmp_path, concurrency)
    print(f"\nconcurrency {concurrency}, {COUNTS[concurrency]} requests per client, both at once")
    print(replayed.line("replay"))
    print(reference.line("reference"))
    timing = document["summary"]["timing"]
    print(
        f"replay's report: TTFT p50 {document['summary']['latency']['ttft']['p50']} s over {timing['measured']} "
        f"requests, {timing['excluded']} excluded for its own delay"
    )
    assert not replayed.below_server(), "replay's TTFT clock started after the server had the request"
    assert not reference.below_server(), "the reference client's clock is wrong"
    if concurrency == 1:
        difference = statistics.median(replayed.excess) - statistics.median(reference.excess)
        assert abs(difference) <= TOLERANCE_S, (
            f"replay's TTFT over the server's own differs from the reference client's by {difference * 1000:.2f} ms"
        )
