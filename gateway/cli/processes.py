"""Child processes that announce their URL on their first stdout line (sims, gateways)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass


class ProcessStartError(RuntimeError):
    pass


@dataclass
class Announced:
    process: subprocess.Popen[str]
    url: str

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_announcing(args: list[str], timeout_s: float = 30.0, env: dict[str, str] | None = None) -> Announced:
    """Start `python -m <args>` and wait for a line ending in its URL (`... listening on URL`)."""
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
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
        if " listening on " in line:
            url = line.strip().rsplit(" ", 1)[-1]
            return Announced(process, url.removesuffix("/v1"))
