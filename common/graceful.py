"""A uvicorn server that stops gracefully on SIGINT, SIGTERM or SIGHUP and then returns.

uvicorn handles SIGINT and SIGTERM only, and after its graceful shutdown it raises the captured
signal again with the default handler restored: the process dies right there, before the
caller's `finally` blocks run. That is how `gateway demo` used to leak its simulated backends, and
why Ctrl-C printed click's `Aborted!`. Returning lets callers clean up and exit quietly.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class GracefulServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # only it may set handlers
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
