"""Child processes that announce their URL on their first stdout line (sims, gateways).

A child lives no longer than the process that started it: it runs in its own session (a
terminal's Ctrl-C reaches only the parent, which stops its children in order) and, on Linux, asks
the kernel for SIGTERM when its parent dies, so even a parent killed outright leaves no orphan.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any


class ProcessStartError(RuntimeError):
    pass


@dataclass
class Announced:
    process: subprocess.Popen[str]
    url: str

    def stop(self, timeout_s: float = 5.0) -> None:
        stop_process(self.process, timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()


def stop_process(process: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM (a graceful stop), then SIGKILL if it is still running after `timeout_s`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)


def announced_url(line: str) -> str | None:
    """The base URL (without /v1) of a `... listening on URL` line; None for any other line."""
    if " listening on " not in line:
        return None
    return line.strip().rsplit(" ", 1)[-1].removesuffix("/v1")


_PARENT_ENV = "AGW_EXIT_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def exit_with_parent() -> None:
    """Run first by `python -m gateway` and `python -m sim`: if `start_announcing` started
    this process, have the kernel send it SIGTERM (a graceful stop) when the parent dies."""
    parent = os.environ.pop(_PARENT_ENV, None)  # popped: our own children get their own
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes  # here: every `gateway` command runs this function, few need ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before the request took effect
        sys.exit(0)


def start_announcing(
    args: list[str], timeout_s: float = 30.0, env: dict[str, str] | None = None, stderr: IO[str] | None = None
) -> Announced:
    """Start `python -m <args>` and wait for a line ending in its URL (`... listening on URL`)."""
    env = {**os.environ, **(env or {})}
    # The kernel signals the child when the *thread* that started it exits: only bind the
    # child's life to the main thread's.
    if threading.current_thread() is threading.main_thread():
        env[_PARENT_ENV] = str(os.getpid())
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        readable, _, _ = select.select([process.stdout], [], [], max(0.0, remaining))
        if not readable:
            process.kill()
            raise ProcessStartError(f"{' '.join(args)} did not announce itself within {timeout_s:g}s")
        line = process.stdout.readline()
        if not line:
            process.wait()
            raise ProcessStartError(f"{' '.join(args)} exited with {process.returncode} before it was ready")
        url = announced_url(line)
        if url is not None:
            return Announced(process, url)
