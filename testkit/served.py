"""A gateway served in a thread of the test process: the same `create_app(settings)` and the same
uvicorn configuration as `gateway serve`, on a real socket on 127.0.0.1, without the ~1.1 s of a
process start (imports, the config read, the first collection).

Tests that kill, signal or restart the gateway, count its processes or read its stderr use a
process (`testkit.procs.gateway_process`); every other test gets one of these.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import uvicorn

from gateway.app import create_app
from gateway.cli.uvicorn_runner import base_url, bind, server_config
from gateway.settings import Settings

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 20.0  # past uvicorn's own graceful shutdown (10 s): then the connections are cut


class _ReadyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:  # the lifespan's startup failed: nothing is served
            self.ready.set()


@contextlib.contextmanager
def serve_in_thread(settings: Settings) -> Iterator[str]:
    """Serve the gateway `settings` describe until the block ends; yields its base URL."""
    sock = bind("127.0.0.1", 0)
    # bind() leaves it inheritable for `--workers`; here it would leak into every child the
    # process starts (an in-process gateway's MCP stdio servers among them).
    sock.set_inheritable(False)
    try:
        server = _ReadyServer(server_config(create_app(settings), settings.server))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gateway", daemon=True)
        thread.start()
        try:
            _started(server, thread)
            yield base_url(sock)
        finally:
            _stop(server, thread)
        if thread.is_alive():  # reported only when the test itself passed: its own failure comes first
            raise RuntimeError(f"the in-process gateway did not stop within {2 * _STOP_TIMEOUT_S:g}s")
    finally:
        sock.close()


def _stop(server: _ReadyServer, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(_STOP_TIMEOUT_S)
    if thread.is_alive():
        server.force_exit = True
        thread.join(_STOP_TIMEOUT_S)


def _started(server: _ReadyServer, thread: threading.Thread) -> None:
    """Wait for the app's startup, or for the server thread to end without it (a failed startup)."""
    waited = 0.0
    while not server.ready.wait(0.05):
        waited += 0.05
        if not thread.is_alive():
            raise RuntimeError("the in-process gateway's startup failed (its log says why)")
        if waited >= _START_TIMEOUT_S:
            raise RuntimeError(f"the in-process gateway did not start within {_START_TIMEOUT_S:g}s")
