"""`gateway replay` next to an independent raw-socket client on the same sim, both at once.

    python -m bench.replay_crosscheck [--rounds 3]

Starts the stamping sim (TTFT 100 ms, TPOT 10 ms, jitter 0; testkit/stamping_sim.py) and, at
concurrency 1 and 16, runs replay and the reference client (testkit/reference_client.py) at
the same time on the same samples. Prints, per round, each client's TTFT p50 / min / max, TPOT p50,
its median excess over the server's own receive-to-first-byte time for the same requests, replay's
own reported TTFT p50 (over the requests its client delay left in), and whether the difference
between the two is within max(2 ms, 3% of TTFT). The CI test
(tests/replay/test_reference_crosscheck.py) holds the per-request floor at both concurrencies and
the margin at concurrency 1; this script is where the margin at 16 is measured.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from testkit.crosscheck import SIM_OPTIONS, STAMPING_SIM, TOLERANCE_S, crosscheck, running_sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with running_sim(*SIM_OPTIONS, module=STAMPING_SIM) as url:
        for round_number in range(1, args.rounds + 1):
            for concurrency in (1, 16):
                with tempfile.TemporaryDirectory(prefix="agw-crosscheck-") as scratch:
                    replayed, reference, document = crosscheck(url, Path(scratch), concurrency)
                difference = statistics.median(replayed.excess) - statistics.median(reference.excess)
                verdict = "within" if abs(difference) <= TOLERANCE_S else "OUTSIDE"
                print(f"round {round_number}, concurrency {concurrency}:")
                print("  " + replayed.line("replay"))
                print("  " + reference.line("reference"))
                timing, ttft = document["summary"]["timing"], document["summary"]["latency"]["ttft"]
                print(
                    f"  replay's own report: TTFT p50 {ttft['p50'] * 1000:.2f} ms over {timing['measured']} "
                    f"requests ({timing['excluded']} excluded for its own delay)"
                )
                print(f"  difference {difference * 1000:+.2f} ms, {verdict} {TOLERANCE_S * 1000:g} ms", flush=True)


if __name__ == "__main__":
    main()
