"""`gateway serve --workers N`: N processes accepting on one socket, under a supervisor.

The supervisor binds the socket, forks the workers (each builds its own app, event loop and store
connections after the fork) and restarts a worker that dies. Workers share nothing in memory, so
they are replicas of one another: exact only on a store that replicas share (Redis). The
embedded store keeps quota counters in its process, so it refuses more than one worker.

The kernel hands each new connection to whichever worker accepts first; a kept-alive connection
stays with its worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import FrameType

from common.graceful import STOP_SIGNALS

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.2
_RESTART_GAP_S = 1.0  # a worker that keeps dying is restarted at most once a second
_STOP_TIMEOUT_S = 15.0  # uvicorn's graceful shutdown (10 s) and a margin


def embedded_refusal(workers: int) -> str:
    return (
        f"--workers {workers} needs the redis store: the embedded store keeps quota counters in "
        "one process, so several workers would each enforce the limits on their own. Use "
        "`store: {kind: redis, ...}` or run one worker per host (--workers 1)."
    )


class Supervisor:
    """Fork `count` workers running `work(sock, ready)`, keep that many alive until SIGINT, SIGTERM
    or SIGHUP, then stop them (SIGTERM: each finishes gracefully, as a single process would)."""

    def __init__(self, sock: socket.socket, count: int, work: Callable[[socket.socket, Callable[[], None]], None]):
        self._sock = sock
        self._count = count
        self._work = work
        self._workers: dict[int, float] = {}  # pid -> start time
        self._stopping = False
        self._ready_r, self._ready_w = os.pipe()

    def run(self, on_ready: Callable[[], None]) -> int:
        previous = {sig: signal.signal(sig, self._stop) for sig in STOP_SIGNALS}
        try:
            for _ in range(self._count):
                self._spawn()
            if not self._wait_ready():
                self._terminate_all()
                return 1
            on_ready()
            self._supervise()
            return 0
        finally:
            self._terminate_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self._ready_r)
            os.close(self._ready_w)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _spawn(self) -> None:
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                for sig in STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                _die_with_parent(supervisor)
                os.close(self._ready_r)
                self._work(self._sock, self._ready)
                code = 0
            except BaseException:  # the worker must never return into the supervisor's code
                logging.getLogger(__name__).exception("worker failed")
            finally:
                os._exit(code)
        self._workers[pid] = time.monotonic()

    def _ready(self) -> None:
        os.write(self._ready_w, b".")

    def _wait_ready(self) -> bool:
        """True once every first-generation worker accepts; False if one dies first."""
        ready = 0
        while ready < self._count:
            if self._stopping:
                return False
            readable, _, _ = select.select([self._ready_r], [], [], _POLL_S)
            if readable:
                ready += len(os.read(self._ready_r, self._count))
            if self._reap():
                log.error("a worker exited before it was ready")
                return False
        return True

    def _supervise(self) -> None:
        while not self._stopping:
            with contextlib.suppress(InterruptedError):
                readable, _, _ = select.select([self._ready_r], [], [], _POLL_S)
                if readable:
                    os.read(self._ready_r, 64)  # a restarted worker is ready; nothing to do
            for pid, started in self._reap():
                if self._stopping:
                    break
                log.warning("worker %d died; starting another", pid)
                time.sleep(max(0.0, _RESTART_GAP_S - (time.monotonic() - started)))
                self._spawn()

    def _reap(self) -> list[tuple[int, float]]:
        dead = []
        for pid in list(self._workers):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                dead.append((pid, self._workers.pop(pid)))
        return dead

    def _terminate_all(self) -> None:
        for pid in self._workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while self._workers and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.02)
        for pid in list(self._workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self._workers.pop(pid)


def _die_with_parent(supervisor: int) -> None:
    """A worker gets SIGTERM when the supervisor dies, even by SIGKILL (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # the supervisor died before prctl took effect
        os._exit(1)
