"""Instructions per request, counted by valgrind: a cost figure that the machine's noise cannot move.

    python -m bench.instructions [--stream] [--concurrency 1] [--requests 300] [--gateway-dir DIR ...]

CPU time on this shared 2-core machine swings by a third from one minute to the next, so a 5%
change is invisible between two runs of `bench.overhead`. Instructions are not: the gateway runs
under `valgrind --tool=callgrind` with instrumentation off (only the interpreter's translation
cost), is warmed up, then counts every instruction of every thread of its process (event loop,
store thread, audit writer) over exactly `--requests` requests of the overhead benchmark's load,
against the same fast upstream, itself not counted. The same code, settings and load give the
same count to within a fraction of a percent; instructions are not time (a cache miss costs more
than an add), so the figure ranks changes, and `bench.overhead` says what they are worth in time.

Instructions are user space only: system calls (socket writes, futex waits of the store's thread)
are not counted; `bench.overhead` measures those with the rest of the CPU time.

`--save DIR` keeps the counted dumps for `callgrind_annotate` (C functions: the interpreter, SQLite,
hashing, JSON; for Python functions use `bench.profile_gateway`). With several `--gateway-dir`s
(checkouts, e.g. `git worktree add /tmp/before HEAD~1`) each is measured in turn and compared with
the first. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.support.loadgen import Pool
from bench.support.procs import Service, running
from bench.support.runner import PathUnderTest, Scenario, make_spec
from bench.support.services import REPO_DIR, gateway_config, serve_gateway, start_keyed_gateway, start_upstream

# Startup under valgrind runs the interpreter ~5x slower even uninstrumented (imports, config).
_START_TIMEOUT_S = 240.0
_CONTROL_TIMEOUT_S = 60.0


def _start_counted_gateway(workdir: Path, upstream_url: str, source_dir: Path, admin_key: str, tag: str) -> Service:
    config = gateway_config(upstream_url, workdir / f"data-{tag}")
    callgrind = (
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={workdir}/callgrind-{tag}.%p",
    )
    return serve_gateway(
        workdir,
        config,
        admin_key,
        name=f"gateway-{tag}",
        stem=f"gateway-{tag}",
        source_dir=source_dir,
        wrapper=callgrind,
        timeout_s=_START_TIMEOUT_S,
    )


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=_CONTROL_TIMEOUT_S)


def _dumps(workdir: Path, tag: str, pid: int) -> set[Path]:
    return set(workdir.glob(f"callgrind-{tag}.{pid}*"))


def _summary(dump: Path) -> int:
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise SystemExit(f"no summary line in {dump}")


async def _load(target: PathUnderTest, scenario: Scenario, chunks: int, requests: int) -> int:
    async with Pool.open(make_spec(target, scenario, chunks), scenario.concurrency, timeout_s=120.0) as pool:
        window = await pool.run(requests, 600.0)
    errors = sum(window.errors.values())
    if errors:
        raise SystemExit(f"{errors} requests failed: {dict(window.errors.most_common(3))}")
    return len(window.samples)


def _measure(
    workdir: Path, upstream_url: str, source_dir: Path, tag: str, scenario: Scenario, options: argparse.Namespace
) -> float:
    with contextlib.ExitStack() as stack:
        gateway, key = start_keyed_gateway(
            stack, lambda admin_key: _start_counted_gateway(workdir, upstream_url, source_dir, admin_key, tag)
        )
        target = PathUnderTest("gateway", gateway.url, gateway, key)
        pid = gateway.process.pid
        asyncio.run(_load(target, scenario, options.chunks, options.warmup))
        counts = []
        for _ in range(options.windows):
            before = _dumps(workdir, tag, pid)
            _control(pid, "--zero")
            _control(pid, "--instr=on")
            started = time.monotonic()
            answered = asyncio.run(_load(target, scenario, options.chunks, options.requests))
            _control(pid, "--dump")
            _control(pid, "--instr=off")
            (dump,) = _dumps(workdir, tag, pid) - before
            counted = _summary(dump)
            if options.save is not None:
                options.save.mkdir(parents=True, exist_ok=True)
                shutil.copy(dump, options.save / f"callgrind.{Path(source_dir).name}.{tag}")
            counts.append(counted / answered)
            took = time.monotonic() - started
            print(f"  {source_dir}: {counted / answered:,.0f} instructions a request ({took:.0f} s)")
        return min(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=300, help="counted requests per window")
    parser.add_argument("--windows", type=int, default=2, help="counted windows per gateway; the least is kept")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--gateway-dir", type=Path, action="append", default=None)
    parser.add_argument("--save", type=Path, default=None, help="keep each gateway's last counted dump here")
    options = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    kind = "stream" if options.stream else "non-stream"
    scenario = Scenario(f"{kind} c={options.concurrency}", options.stream, options.concurrency, options.requests)
    sources = options.gateway_dir or [REPO_DIR]
    with tempfile.TemporaryDirectory(prefix="agw-instructions-") as scratch:
        workdir = Path(scratch)
        with running(start_upstream(workdir, options.chunks)) as upstream:
            results = [
                (source, _measure(workdir, upstream.url, source, str(n), scenario, options))
                for n, source in enumerate(sources)
            ]
    print(f"\n{scenario.name}, {options.chunks} chunks, instructions a request (least of {options.windows} windows)")
    baseline = results[0][1]
    for source, count in results:
        print(f"{count:>14,.0f}  {count / baseline - 1:+7.2%}  {source}")


if __name__ == "__main__":
    main()
