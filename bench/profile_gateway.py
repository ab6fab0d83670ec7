"""Where the gateway's CPU goes: py-spy samples the gateway process while the overhead
benchmark's load runs (one scenario), and the top functions by own and total samples are printed.

    pip install py-spy
    python -m bench.profile_gateway [--stream] [--api responses] [--concurrency 32] [--requests 6000]

py-spy needs ptrace rights on the child (it runs as the same user; in a container, SYS_PTRACE).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.support.loadgen import Pool
from bench.support.procs import running
from bench.support.runner import PathUnderTest, Scenario, make_spec
from bench.support.services import REPO_DIR, start_gateway, start_keyed_gateway, start_upstream


def _summary(raw: Path, top: int) -> str:
    """py-spy's --format raw is one collapsed stack per line with a count: sum self and total."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        samples += count
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0] + ")" for f in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    lines = [f"{samples} samples", "", "own %  function"]
    lines += [f"{100 * n / samples:5.1f}  {name}" for name, n in own.most_common(top)]
    lines += ["", "total %  function"]
    lines += [f"{100 * n / samples:5.1f}  {name}" for name, n in total.most_common(top)]
    return "\n".join(lines)


async def _load(path: PathUnderTest, scenario: Scenario, chunks: int, requests: int) -> None:
    async with Pool.open(make_spec(path, scenario, chunks), scenario.concurrency) as pool:
        await pool.run(min(500, requests), 30)  # warm-up, not sampled differently: short
        window = await pool.run(requests, 120)
    print(f"{len(window.samples)} answers, {sum(window.errors.values())} errors in {window.elapsed_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--api", choices=["chat", "responses"], default="chat", help="the API the load speaks")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--gateway-dir", type=Path, default=REPO_DIR)
    parser.add_argument("--out", type=Path, default=None, help="also write the raw collapsed stacks here")
    options = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    scenario = Scenario("profile", options.stream, options.concurrency, options.requests)
    with tempfile.TemporaryDirectory(prefix="agw-profile-") as scratch, contextlib.ExitStack() as stack:
        workdir = Path(scratch)
        upstream = stack.enter_context(running(start_upstream(workdir, options.chunks)))
        gateway, key = start_keyed_gateway(
            stack, lambda admin: start_gateway(workdir, upstream.url, options.gateway_dir, admin)
        )
        raw = options.out or workdir / "stacks.txt"
        argv = [spy, "record", "--pid", str(gateway.process.pid), "--rate", str(options.rate)]
        recorder = subprocess.Popen([*argv, "--format", "raw", "--output", str(raw)])
        try:
            target = PathUnderTest("gateway", gateway.url, gateway, key, api=options.api)
            asyncio.run(_load(target, scenario, options.chunks, options.requests))
        finally:
            recorder.send_signal(2)  # py-spy writes its output on SIGINT
            recorder.wait(timeout=60)
        print(_summary(raw, options.top))


if __name__ == "__main__":
    main()
