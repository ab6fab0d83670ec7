"""A one-time local listener for the candidate's request path, for the length of one preflight.

The replay smoke run measures TTFT and TPOT over real HTTP from a child process (the eval cases go
in process, where httpx buffers whole responses and no timing would mean anything). So the pinned
app of candidate_app.py is served on 127.0.0.1 on a port the kernel picks, and only to a caller
holding a random token made for this listener: anyone else on the machine (another user, a
browser page posting to localhost) gets 401 and never reaches a path that runs as the operator.
The listener is closed however the preflight ends: finished, timed out or cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.core.error_bodies import error_body
from gateway.http.connection_guard import guarded_protocol
from gateway.releases.candidate import Listener, ListenerNotStarted

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 10.0
_SHUTDOWN_TIMEOUT_S = 5.0
_GRACEFUL_S = 1  # requests still running when the smoke run is over are abandoned after this
# Any local user can connect before the token is checked: request heads that do not arrive are cut,
# and connections waiting for one capped, as on the gateway's own port. The smoke run itself keeps
# two requests open at a time.
_HEADER_TIMEOUT_S = 10.0
_MAX_PENDING = 16
_MAX_CONCURRENCY = 32


class _ServerLog(logging.Logger):
    """uvicorn's log of this listener's requests. uvicorn cancels a request still running when
    the listener closes and logs that as an application error with its traceback: here it is the
    expected end of a smoke request the preflight no longer waits for (a timed-out smoke run)."""

    def error(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(kwargs.get("exc_info"), asyncio.CancelledError):
            self.info("a request still running when the preflight listener closed was cancelled")
            return
        super().error(msg, *args, **kwargs)


def _server_log() -> logging.Logger:
    server_log = _ServerLog(f"{__name__}.server")
    server_log.parent = log  # not registered with logging: one per listener, gone with it
    return server_log


class _Quiet(uvicorn.Server):
    """Runs inside the gateway's event loop: the gateway's own server owns the signals."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


def _guarded(app: ASGIApp, token: str) -> ASGIApp:
    expected = f"Bearer {token}".encode()
    refusal = orjson.dumps(error_body("a preflight listener: wrong token", "authentication_error", "invalid_api_key"))

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        given = next((value for name, value in scope["headers"] if name.lower() == b"authorization"), b"")
        if not hmac.compare_digest(given, expected):
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(refusal)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": refusal})
            return
        # The token is for this door only: nothing behind it sees (or could log) it.
        headers = [h for h in scope["headers"] if h[0].lower() != b"authorization"]
        await app({**scope, "headers": headers}, receive, send)

    return guarded


@contextlib.asynccontextmanager
async def serve_once(app: ASGIApp) -> AsyncIterator[Listener]:
    """Serve `app` on 127.0.0.1:<free port> behind a fresh token until the block ends."""
    token = secrets.token_urlsafe(32)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
        except OSError as error:
            raise ListenerNotStarted(f"127.0.0.1: {error}") from error
        config = uvicorn.Config(
            _guarded(app, token),
            http=guarded_protocol(_HEADER_TIMEOUT_S, _MAX_PENDING, _server_log()),
            limit_concurrency=_MAX_CONCURRENCY,
            ws="none",
            lifespan="off",
            log_level=None,  # the gateway's logging stays as it is
            log_config=None,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=_GRACEFUL_S,
        )
        server = _Quiet(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        try:
            await _started(server, task)
            yield Listener(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", token)
        finally:
            await _stop(server, task)
    finally:
        sock.close()  # at once, even if the server's shutdown was cut short


async def _started(server: _Quiet, task: asyncio.Task[None]) -> None:
    ready = asyncio.ensure_future(server.ready.wait())
    try:
        await asyncio.wait({ready, task}, timeout=_STARTUP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ready.cancel()
    if not server.ready.is_set():
        if task.done() and task.exception() is not None:
            raise ListenerNotStarted(repr(task.exception())) from task.exception()
        raise ListenerNotStarted(f"not serving within {_STARTUP_TIMEOUT_S:g}s")


async def _stop(server: _Quiet, task: asyncio.Task[None]) -> None:
    server.should_exit = True
    for listening in getattr(server, "servers", []):
        listening.close()  # refuse new connections now; the rest of the shutdown may take a moment
    try:
        await asyncio.wait_for(asyncio.shield(task), _SHUTDOWN_TIMEOUT_S)
    except asyncio.CancelledError:
        await _abandon(task)
        raise
    except TimeoutError:
        log.warning("the preflight listener did not stop within %gs; cancelled", _SHUTDOWN_TIMEOUT_S)
        await _abandon(task)
    except Exception:  # the smoke run's verdict stands; the server's own failure is only logged
        log.exception("the preflight listener failed")


async def _abandon(task: asyncio.Task[None]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        # The server task's cancellation is ours to expect; the caller's own (the preflight was
        # cancelled meanwhile) must go on up.
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # the server's own failure changes nothing about the preflight now
        log.exception("the abandoned preflight listener failed")
