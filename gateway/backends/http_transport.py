"""A small keep-alive HTTP/1.1 client for every upstream request: asyncio protocols and httptools.

httpx (with httpcore, h11 and anyio beneath it) spent ~0.9 ms of CPU on every streamed request
here, most of it per SSE chunk (an h11 event, an anyio read, a timeout scope each), and its pool
looks at every idle connection (a poll() each) whenever a request starts or ends. This client
parses whatever one read brought in one go and hands all of it over at once; a connection learns
that the server closed it from `connection_lost`, so nothing is polled.

It does one thing: requests with a bytes body to one origin (http, or https through `ssl`, directly
or through an HTTP proxy's CONNECT tunnel; a forward proxy is an origin whose requests name their
absolute URL), and responses with a content-length, chunked or read-until-close body, identity,
gzip or deflate encoded. `upstream_route` works out, from a deployment's URL and the environment,
where to connect and what to send.

A request on a reused keep-alive connection that closes without a byte of answer is sent once more
on a new connection, POST included (aiohttp retries only idempotent methods). The race it covers is
the server closing an idle connection as the request goes out; a server that read the request and
then died without answering is the only case where the upstream sees it twice. For a chat
completion that costs compute, not state (there is nothing it could do twice), and the router would
make the same second attempt anyway, after counting a failure against a healthy deployment.

A response its caller drops without `aclose` (a consumer that went away) closes its connection when
it is collected, so that its pool slot is not held until the upstream happens to close the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import httptools

from gateway.backends.http_tunnel import open_tunnel

# Waits for a future the connection resolves when something arrives; the backend's deadline
# fails it instead when the upstream takes too long. The transport itself never times a read.
Wait = Callable[[asyncio.Future[None]], Awaitable[None]]

_MAX_HEAD_BYTES = 64 * 1024  # status line and headers; model servers send a few hundred bytes
_HIGH_WATER = 1024 * 1024  # unread body bytes at which reading pauses: memory stays bounded
_KEEPALIVE_S = 5.0  # as httpx: an idle connection older than this is not trusted with a request
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FORBIDDEN_IN_VALUE = re.compile(r"[\r\n\x00]")


class TransportError(Exception):
    """What went wrong talking to the upstream, before the backend names it for the router."""


class ConnectFailed(TransportError):
    pass


class ConnectTimedOut(TransportError):
    pass


class ConnectionBroken(TransportError):
    """The connection was cut, reset or sent something that is not HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class Tunnel:
    """An HTTP proxy to ask for a CONNECT tunnel to the origin, which TLS then runs through."""

    host: str
    port: int
    head: bytes = field(repr=False)  # the CONNECT request, with the proxy's credentials if it has any


@dataclass(frozen=True, slots=True)
class Origin:
    host: str  # as connected to (or tunnelled to): an IPv6 address without brackets
    port: int
    tls: ssl.SSLContext | None
    tunnel: Tunnel | None = None
    unusable: str | None = None  # why no connection can be made: every request fails with it


class RequestTemplate:
    """One method and path with fixed headers, rendered once; a request adds only its body."""

    def __init__(self, method: str, target: str, host: str, headers: dict[str, str]) -> None:
        self._method = method
        self._target = target
        self._headers = {"host": host, **{k.lower(): v for k, v in headers.items()}}
        self._head = self._render_head(self._headers)
        self._has_body = method not in ("GET", "HEAD")  # no content-length: 0 on a bodiless request

    def render(self, body: bytes, extra: Mapping[str, str] | None = None) -> bytes:
        head = self._render_head({**self._headers, **{k.lower(): v for k, v in extra.items()}}) if extra else self._head
        if not self._has_body:
            return head + b"\r\n"
        return b"%scontent-length: %d\r\n\r\n%s" % (head, len(body), body)

    def _render_head(self, headers: dict[str, str]) -> bytes:
        lines = [f"{self._method} {self._target} HTTP/1.1"]
        for name, value in headers.items():
            # A CR or LF in a header would let a value smuggle its own headers or requests.
            if not _TOKEN.fullmatch(name) or _FORBIDDEN_IN_VALUE.search(value):
                raise ValueError(f"invalid HTTP header {name!r}")
            if name != "content-length":
                lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; httptools calls the `on_*` methods from `data_received`."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self.counted = True  # holds one of the pool's connection slots until it is forgotten
        self.closed = False
        self.used = False  # has served a response: it may have been dropped by the server while idle
        self.idle_since = 0.0
        self.headers: list[tuple[bytes, bytes]] = []
        self._reset(active=False)

    def _reset(self, active: bool) -> None:
        self.status = 0
        self.headers = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.received = 0
        self.error: TransportError | None = None
        self._until_eof = True  # neither content-length nor chunked: the body ends with the connection
        self._body: list[bytes] = []
        self._buffered = 0
        self._active = active
        self._draining = False
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, though they implement it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if not self._active:
            # Nothing was asked: bytes on an idle connection mean it can no longer be trusted.
            self.fail(ConnectionBroken("unexpected data on an idle connection"))
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self.fail(ConnectionBroken(f"malformed HTTP response: {exc}"))
            return
        if not self.head_done and self.received > _MAX_HEAD_BYTES:
            self.fail(ConnectionBroken("response head too large"))
            return
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._active and not self.complete and self.error is None:
            if self.head_done and self._until_eof:
                self.complete = True  # a read-until-close body ends here, and cleanly
            else:
                detail = f": {exc!r}" if exc is not None else ""
                self.error = ConnectionBroken(f"upstream closed the connection mid-response{detail}")
        self._stop_drain_timer()
        self._wake()
        self._pool.forget(self)

    def on_message_begin(self) -> None:
        if self.complete or not self._active:
            # A second response to one request: raising stops the parser before it touches the
            # first one, and the connection is not used again.
            raise ConnectionBroken("unexpected data after the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
            self._until_eof = False

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # an interim response (103 Early Hints, 100 Continue): the real one follows
            self.headers, self._until_eof = [], True
            return
        self.status = status
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        if self._draining:
            return
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def on_message_complete(self) -> None:
        if not self.head_done:
            return  # the end of an interim response
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        if self._draining:
            self._stop_drain_timer()
            self.release()

    def send(self, data: bytes) -> None:
        self._reset(active=True)
        if self._transport is None or self._transport.is_closing():
            self.error = ConnectionBroken("connection closed before the request was sent")
            return
        self._transport.write(data)

    async def read_head(self, wait: Wait) -> None:
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self._wait(wait)

    async def read_body(self, wait: Wait) -> bytes:
        """Everything that arrived since the last call; b"" once the body has ended."""
        while not self._body:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait(wait)
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def _wait(self, wait: Wait) -> None:
        waiter = self._waiter = self._pool.loop.create_future()
        try:
            await wait(waiter)
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def release(self) -> None:
        """Back to the pool if it can serve another request, else closed."""
        if self.complete and self.keep_alive and self.error is None and not self.closed:
            self._reset(active=False)
            self._pool.put(self)
        else:
            self.close()

    def drain_then_release(self, timeout_s: float) -> None:
        """Read the rest of the body in the background, then release; close if it takes too long.

        For a response whose caller has all it needs ([DONE]) while the body's end (the last
        chunk) is still on its way: the caller returns at once, and the connection is not lost.
        """
        if self.complete or self.error is not None or self.closed:
            self.release()
            return
        self._draining = True
        self._body = []
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        self._drain_timer = self._pool.loop.call_later(timeout_s, self.close)

    def _stop_drain_timer(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None

    def fail(self, error: TransportError) -> None:
        if self.error is None:
            self.error = error
        self.close()
        self._wake()

    def close(self) -> None:
        if not self.complete and self.error is None:
            self.error = ConnectionBroken("connection closed")  # for a read that may still come
        self._active = False
        self._stop_drain_timer()
        if self._transport is not None and not self.closed:
            self._transport.close()
        elif self._transport is None:
            self._pool.forget(self)
        self._wake()


class Response:
    """The head of one response, and its body as it arrives (decoded)."""

    __slots__ = ("_conn", "_decoder", "_wait", "status")

    def __init__(self, conn: _Connection, wait: Wait) -> None:
        self._conn: _Connection | None = conn
        self._wait = wait
        self.status = conn.status
        self._decoder = _decoder(self.header("content-encoding"))

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        conn = self._connection()
        found = [value for key, value in conn.headers if key.lower() == wanted]
        return found[-1].decode("latin-1") if found else None

    async def receive(self) -> bytes:
        """The next part of the body, decoded; b"" once it has ended."""
        conn = self._connection()
        while True:
            data = await conn.read_body(self._wait)
            decoder = self._decoder
            if decoder is None:
                return data
            try:
                if not data:
                    self._decoder = None
                    return decoder.flush()  # b"" when nothing was left, which ends the body
                decoded = decoder.decompress(data)
            except zlib.error as exc:
                raise ConnectionBroken(f"cannot decode the response body: {exc}") from None
            if decoded:
                return decoded

    async def aclose(self, drain_s: float | None = None) -> None:
        """Done with it. With `drain_s`, the rest of the body is read in the background, within
        that time, so that the connection serves again; without it, an unfinished body closes it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if drain_s is None:
            conn.release()
        else:
            conn.drain_then_release(drain_s)

    def __del__(self) -> None:
        conn = self._conn
        if conn is not None:
            # Dropped unreleased: closing is what frees the slot. The loop may be gone already.
            with contextlib.suppress(RuntimeError):
                conn.close()

    def _connection(self) -> _Connection:
        if self._conn is None:
            raise RuntimeError("response already released")
        return self._conn


def _decoder(encoding: str | None) -> zlib._Decompress | None:
    value = (encoding or "identity").strip().lower()
    if value == "identity":
        return None
    if value in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if value == "deflate":
        return zlib.decompressobj()
    raise ConnectionBroken(f"unsupported content-encoding {encoding!r}")


class ConnectionPool:
    """Keep-alive connections to one origin, most recently used first, at most `max_connections`."""

    def __init__(self, origin: Origin, *, max_connections: int, connect_timeout_s: float) -> None:
        self._origin = origin
        self._max = max_connections
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        # Looked up each time, not kept: a pool built, or first used, under another loop still works.
        return asyncio.get_running_loop()

    async def request(self, data: bytes, wait: Wait, limit_at: float) -> Response:
        """Send a rendered request; return once the response head is in.

        `limit_at` (loop time) bounds connecting, on top of the connect timeout; running past it
        raises TimeoutError, as the backend's deadline would. Reads are timed by `wait`.
        """
        conn = await self._acquire(limit_at, fresh=False)
        try:
            return await self._exchange(conn, data, wait)
        except ConnectionBroken:
            if not (conn.used and conn.received == 0):
                raise
        # A reused connection that closed before answering at all was, almost surely, dropped by
        # the server while idle (its keep-alive timeout) as the request went out: once more, on a
        # new connection. The race is short, so this is rare; any other failure is the caller's.
        return await self._exchange(await self._acquire(limit_at, fresh=True), data, wait)

    async def _exchange(self, conn: _Connection, data: bytes, wait: Wait) -> Response:
        try:
            conn.send(data)
            await conn.read_head(wait)
            return Response(conn, wait)
        except BaseException:
            conn.close()
            raise

    async def _acquire(self, limit_at: float, fresh: bool) -> _Connection:
        room_by = min(self.loop.time() + self._connect_timeout_s, limit_at)
        while True:
            conn = None if fresh else self._take_idle()
            if conn is not None:
                return conn
            if self._closed:
                raise ConnectFailed("connection pool closed")
            if self._open < self._max:
                return await self._connect(limit_at)
            await self._wait_for_room(room_by, limit_at)

    def _take_idle(self) -> _Connection | None:
        expired_before = self.loop.time() - _KEEPALIVE_S
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.error is None and conn.idle_since >= expired_before:
                return conn
            conn.close()
        return None

    async def _connect(self, limit_at: float) -> _Connection:
        conn = _Connection(self)
        self._open += 1
        timeout_at = min(self.loop.time() + self._connect_timeout_s, limit_at)
        try:
            async with asyncio.timeout_at(timeout_at):
                await self._open_connection(conn)
        except TimeoutError:
            self.forget(conn)
            if timeout_at >= limit_at:
                raise  # the caller's deadline, not the connect timeout
            raise ConnectTimedOut(f"no connection within {self._connect_timeout_s:g}s") from None
        except OSError as exc:  # refused, unreachable, DNS, TLS handshake (an untrusted certificate)
            self.forget(conn)
            raise ConnectFailed(repr(exc)) from None
        except BaseException:
            self.forget(conn)
            raise
        return conn

    async def _open_connection(self, conn: _Connection) -> None:
        origin = self._origin
        if origin.unusable is not None:
            raise ConnectionRefusedError(origin.unusable)
        server_hostname = origin.host if origin.tls is not None else None
        if origin.tunnel is None:
            await self.loop.create_connection(
                lambda: conn, origin.host, origin.port, ssl=origin.tls, server_hostname=server_hostname
            )
            return
        raw = await open_tunnel(self.loop, origin.tunnel.host, origin.tunnel.port, origin.tunnel.head)
        if origin.tls is None:
            raw.set_protocol(conn)
            conn.connection_made(raw)
            return
        try:
            secured = await self.loop.start_tls(raw, conn, origin.tls, server_hostname=server_hostname)
        except BaseException:
            raw.close()
            raise
        if secured is None:  # only for a transport that is already closing
            raise ConnectionResetError("the tunnel closed during the TLS handshake")
        conn.connection_made(secured)

    async def _wait_for_room(self, timeout_at: float, limit_at: float) -> None:
        # Only when every connection is busy: the router caps in-flight requests per deployment
        # at the same number, so this is the rare path and may be simple rather than fair.
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(timeout_at):
                await waiter
        except TimeoutError:
            if timeout_at >= limit_at:
                raise
            raise ConnectTimedOut(f"no free connection within {self._connect_timeout_s:g}s") from None
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def put(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        conn.used = True
        conn.idle_since = self.loop.time()
        self._idle.append(conn)
        self._wake_waiters()

    def forget(self, conn: _Connection) -> None:
        """The connection is gone (or never came): its slot is free."""
        if conn.counted:
            conn.counted = False
            self._open -= 1
        if conn in self._idle:
            self._idle.remove(conn)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        # Every waiter looks again: a wake-up lost to a cancelled waiter cannot strand the rest.
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._wake_waiters()
