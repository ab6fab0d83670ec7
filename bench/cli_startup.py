"""How long small `gateway` commands take to answer: each command run N times as a fresh process,
alternating commands, median and max of the wall time. `python -m bench.cli_startup [--runs N]`.

Startup is dominated by imports, so this is also a check that the CLI imports lazily: the modules
each command loaded that are heavy (web framework, server, Redis, providers) are listed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = [
    ["--help"],
    ["--version"],
    ["keys", "--help"],
    ["sim", "--help"],
    ["plan", "--params", "7e9", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--context", "8192"],
]
GATEWAY = str(Path(sys.executable).with_name("gateway"))  # the console script a user runs
HEAVY = ["fastapi", "starlette", "uvicorn", "redis", "litellm", "torch", "opentelemetry.sdk", "httpx", "pydantic"]
_PROBE = """import sys, runpy
sys.argv = ["gateway", *sys.argv[1:]]
try:
    runpy.run_module("gateway", run_name="__main__")
except SystemExit:
    pass
print(" ".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def timed(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([GATEWAY, *args], stdout=subprocess.DEVNULL, check=True, timeout=60)
    return time.perf_counter() - started


def heavy_modules(args: list[str]) -> str:
    probe = _PROBE.format(heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60
    )
    return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    times: dict[str, list[float]] = {" ".join(c): [] for c in COMMANDS}
    for _ in range(runs):
        for command in COMMANDS:
            times[" ".join(command)].append(timed(command))
    print("| command | runs | median s | max s | heavy modules imported |\n|---|---|---|---|---|")
    for command in COMMANDS:
        name = " ".join(command)
        series = times[name]
        shown = name if len(name) < 40 else name[:37] + "..."
        median, worst = statistics.median(series), max(series)
        print(f"| `gateway {shown}` | {runs} | {median:.3f} | {worst:.3f} | {heavy_modules(command)} |")


if __name__ == "__main__":
    main()
