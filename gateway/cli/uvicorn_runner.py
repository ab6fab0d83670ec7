"""Running an ASGI app under uvicorn on a socket we bind ourselves, so that port 0 works and the
URL we print is the one that is accepting connections."""

from __future__ import annotations

import errno
import gc
import importlib.util
import socket
import sys
from collections.abc import Callable
from typing import Any

import click
import uvicorn

from common.graceful import GracefulServer
from gateway.http.connection_guard import guarded_protocol
from gateway.settings import ServerSettings

YOUNG_COLLECTION_THRESHOLD = 10_000


class _AnnouncingServer(GracefulServer):
    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:  # lifespan startup can fail; then there is nothing to announce
            # What startup built (modules, the app, its settings: ~90k objects) lives as long as
            # the process. Out of the collector's reach, a full collection scans only what requests
            # made since: its longest pause under load went from 86 ms to 6 ms (bench.overhead,
            # c=32), which was most of the p99. Startup's garbage is collected first, not frozen.
            gc.collect()
            gc.freeze()
            # Requests allocate containers faster than they free them for a while: at the default
            # young threshold (700) 2,976 non-streamed requests at c=32 ran 429 young and 38 middle
            # collections, 0.07 ms of CPU a request (a tenth of it; gc.callbacks, in process). At
            # 10,000 they ran one (2.5 ms). The older generations' thresholds are unchanged.
            gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
            # A request runs ~25 async generators (a stage each, the router's layers). The loop's
            # first-iteration hook adds each to a WeakSet only so that closing the loop can close
            # those still open, and each is already closed where it is used (contextlib.aclosing),
            # on every exit. Without that hook (the finalizer hook stays, so a generator dropped
            # unclosed is still closed on the loop) a request took ~5% less CPU, paired in process.
            # The loop puts its own hooks back when it stops.
            sys.set_asyncgen_hooks(firstiter=None, finalizer=sys.get_asyncgen_hooks().finalizer)
            self._on_ready()


def port_in_use(host: str, port: int, flag: str = "--port", free: str = "0") -> click.ClickException:
    """The one line a newcomer needs instead of a traceback: which port, and what to do."""
    return click.ClickException(
        f"port {port} on {host} is already in use: stop what is listening there, or pass {flag} {free} to pick "
        + ("free ports" if "," in free else "a free port")
    )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise port_in_use(host, port) from None
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server_config(app: Any, limits: ServerSettings | None = None) -> uvicorn.Config:
    """How the gateway is served: with `limits` (the server settings), slow, never-finished or
    oversized request heads are cut and connections waiting for one are capped
    (`gateway/http/connection_guard.py`). The tests' in-process gateways are served the same way."""
    http: Any = "httptools" if importlib.util.find_spec("httptools") else "h11"
    if limits is not None:
        http = guarded_protocol(
            limits.header_timeout_s, limits.max_unauthenticated_connections, max_head_bytes=limits.max_header_bytes
        )
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        log_config=None,  # uvicorn's records go to the root logger: JSON lines like the gateway's own
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http=http,
        timeout_graceful_shutdown=10,
    )


def serve(app: Any, sock: socket.socket, on_ready: Callable[[], None], limits: ServerSettings | None = None) -> None:
    """Serve until SIGINT, SIGTERM or SIGHUP, then return; `on_ready` runs once the app has started
    and accepts."""
    server = _AnnouncingServer(server_config(app, limits), on_ready)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
