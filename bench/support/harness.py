"""What every benchmark script does around its measurement: the command line, the machine, the
results file, the closing lines of the report, the Markdown tables and the exit status."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson

from common.processes import ProcessStartError

T = TypeVar("T")


def command_line(module: str) -> str:
    """The command that ran this benchmark (`module` as `python -m` takes it), to run it again."""
    return shlex.join(["python", "-m", module, *sys.argv[1:]])


def machine(with_platform: bool = False) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    info["load_average"] = os.getloadavg()
    if with_platform:
        info["platform"] = platform.platform()
    return info


def options_dict(options: Any) -> dict[str, Any]:
    """A frozen dataclass of options as JSON can hold it (paths as strings)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(options).items()}


def write_results(out_dir: Path, name: str, document: dict[str, Any]) -> Path:
    """Write `document` to `out_dir/<name>-<UTC timestamp>.json`."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{stamp}.json"
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    return path


def machine_line(load_at_start: float) -> str:
    info = machine()
    loads = f"{load_at_start:.2f} at the start, {info['load_average'][0]:.2f} at the end"
    return f"Machine: {info['cpus']} CPUs, Python {info['python']}, load average {loads}."


def command_report_line(module: str, took_s: float) -> str:
    return f"Command: `{command_line(module)}` (took {took_s:.0f} s)"


def cell(value: float | None, digits: int, grouped: bool = True) -> str:
    """A table cell: "-" for no value."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if grouped else f"{value:.{digits}f}"


def mib(value: float) -> str:
    return f"{value / 2**20:.0f} MiB"


def yes_no(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "no")


def markdown(head: str | Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table: `head` is the header line (or its cells); one line per row of cells."""
    head_line = head if isinstance(head, str) else "| " + " | ".join(head) + " |"
    columns = head_line.count("|") - 1
    lines = [head_line, "|" + "---|" * columns]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def run_benchmark(
    measure: Callable[[], T],
    report: Callable[[T, float], None],
    write: Callable[[T, float], Path],
    started: float,
    verdict: Callable[[T], int] | None = None,
) -> int:
    """Measure, print the report and the results file; exit status 1 when a process did not start,
    else what `verdict` says of the outcome (0 without one)."""
    try:
        outcome = measure()
    except ProcessStartError as exc:
        print(f"cannot run the benchmark: {exc}", file=sys.stderr)
        return 1
    took_s = time.monotonic() - started
    report(outcome, took_s)
    print(f"Raw figures: {write(outcome, took_s)}")
    return verdict(outcome) if verdict is not None else 0
