"""Running the sim as a server process.

`run_sim` binds its own socket so that port 0 works, and prints one line,
`sim listening on http://HOST:PORT/v1`, once connections are being accepted: callers that start
the sim as a subprocess read that line to learn the URL and to know it is ready.
"""

from __future__ import annotations

import logging
import socket
import sys

import uvicorn

from common.graceful import GracefulServer
from sim.app import create_sim_app
from sim.profile import SimProfile, load_profile
from sim.respond import SimulatedCut

__all__ = ["SimProfile", "bind_socket", "load_profile", "run_sim", "sim_url"]

# A stalled stream never ends on its own; do not let it hold up shutdown.
_GRACEFUL_SHUTDOWN_S = 1


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket; the server starts listening on it."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def sim_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


class _AnnouncingServer(GracefulServer):
    """A uvicorn server that prints the ready line once it accepts connections."""

    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            print(f"sim listening on {self._url}", flush=True)


class _HideSimulatedCuts(logging.Filter):
    """Drops uvicorn's traceback for connections the sim cut on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SimulatedCut)


def run_sim(host: str, port: int, profile: SimProfile) -> None:
    """Serve the sim until SIGINT, SIGTERM or SIGHUP; `port=0` picks a free port (see the printed line)."""
    sock = bind_socket(host, port)
    config = uvicorn.Config(
        create_sim_app(profile),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
    )
    # After Config: building it (re)configures uvicorn's loggers.
    logging.getLogger("uvicorn.error").addFilter(_HideSimulatedCuts())
    server = _AnnouncingServer(config, sim_url(sock))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        sys.exit(1)
