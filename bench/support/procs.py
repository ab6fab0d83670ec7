"""Starting and watching the processes the benchmark measures: the upstream, the gateway, LiteLLM.

Each child writes its stdout and stderr to a log file rather than a pipe: nobody reads a pipe
after startup, and a chatty child (LiteLLM prints a banner and warnings) would block on a full
one in the middle of a measured window (hence not `common.processes.start_announcing`, which
reads its child's pipe; the announcement line, the stop and the error are shared with it). CPU
and memory come from /proc, summed over the child and its descendants, so that a proxy that
forks workers is charged for all of them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.processes import ProcessStartError, announced_url, stop_process

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_POLL_S = 0.05


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    url: str  # base URL, without /v1
    log_path: Path

    def pids(self) -> list[int]:
        return [self.process.pid, *descendants(self.process.pid)]

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_process(self.process, timeout_s)


@contextlib.contextmanager
def running(service: Service) -> Iterator[Service]:
    """Stop the service when the block ends, however it ends."""
    try:
        yield service
    finally:
        service.stop()


def _spawn(argv: Sequence[str], log_path: Path, cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _failed(name: str, log_path: Path, why: str) -> ProcessStartError:
    return ProcessStartError(f"{name} {why}; last lines of {log_path}:\n{_log_tail(log_path)}")


def start_announcing(
    name: str, argv: Sequence[str], log_path: Path, cwd: Path, env: Mapping[str, str], timeout_s: float
) -> Service:
    """Start a child that prints `... listening on URL` once ready; poll its log for that line."""
    process = _spawn(argv, log_path, cwd, env)
    for _ in range(int(timeout_s / _POLL_S)):
        for line in log_path.read_text(errors="replace").splitlines():
            url = announced_url(line)
            if url is not None:
                return Service(name, process, url, log_path)
        if process.poll() is not None:
            raise _failed(name, log_path, f"exited with {process.returncode} before it was ready")
        time.sleep(_POLL_S)
    Service(name, process, "", log_path).stop()
    raise _failed(name, log_path, f"did not announce itself within {timeout_s:g}s")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_polled(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    cwd: Path,
    env: Mapping[str, str],
    url: str,
    ready_path: str,
    timeout_s: float,
) -> Service:
    """Start a child that announces nothing parseable; poll `url + ready_path` a bounded number of times."""
    process = _spawn(argv, log_path, cwd, env)
    service = Service(name, process, url, log_path)
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.25) + 1):
        if process.poll() is not None:
            raise _failed(name, log_path, f"exited with {process.returncode} before it was ready")
        if _answers(url + ready_path):
            return service
        if time.monotonic() > deadline:
            break
        time.sleep(0.25)
    service.stop()
    raise _failed(name, log_path, f"was not ready within {timeout_s:g}s")


def free_port() -> int:
    # Racy in principle (the port is free only until someone else takes it), but only LiteLLM
    # needs it, and it cannot bind port 0 and tell us which port it got.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tasks(pid: int) -> list[Path]:
    """The /proc/PID/task/TID directories of a process; none when it is gone."""
    try:
        return list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []


def _proc_texts(pids: Sequence[int], name: str) -> Iterator[str]:
    """/proc/PID/<name> of each process still there (one that is gone was not measured for long)."""
    for pid in pids:
        try:
            yield Path(f"/proc/{pid}/{name}").read_text()
        except OSError:
            continue


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in _tasks(pid):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of these processes (all their threads), from /proc/PID/stat."""
    total = 0
    for stat in _proc_texts(pids, "stat"):
        fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
        total += int(fields[11]) + int(fields[12])  # utime and stime, fields 14 and 15 of stat(5)
    return total / _CLOCK_TICKS


def run_time_s(pids: Sequence[int]) -> float:
    """CPU time of these processes' threads in ns resolution (/proc/PID/task/TID/schedstat), where
    /proc/PID/stat counts 10 ms clock ticks: too coarse to tell a 50 ms interval idle or not."""
    total = 0
    for pid in pids:
        for task in _tasks(pid):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
    return total / 1e9


def rss_bytes(pids: Sequence[int]) -> int:
    total = 0
    for status in _proc_texts(pids, "status"):
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
