"""The server's connections: bounded while they send their request head, and written once a turn.

uvicorn times out idle keep-alive connections, but not a request head that arrives slowly (or
never): a slowloris client could hold any number of connections open. Until its head is complete
a connection cannot have been authenticated, so this is also the cap on unauthenticated
connections; after that, an authenticated client is bounded by its quotas and the body timeout
(`server.body_timeout_s`, enforced where the body is read).

Nor does uvicorn bound a head's size with httptools (only its h11 path has a limit): an 8 MiB
header was read, copied and parsed whole before the app could answer 401, +17 MB of RSS a
request. The parser is fed at most `max_head_bytes` of a head (the request line and headers);
a head that has not ended by then is answered 431 and the connection closed, unparsed beyond it.

A response's head and its body come in two ASGI sends, which uvicorn writes one by one: two
`write` system calls (on loopback each runs the whole TCP path to the peer) and two segments the
client wakes up for. `OneWritePerTurn` holds what is written during one turn of the event loop
and writes it at the end of the turn, or as soon as the response is complete: a non-streamed
answer leaves in one call, with no wait, and a stream's head with the events ready with it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.core.error_bodies import error_body

_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
# Like common proxies (nginx 4 x 8 KiB, Node.js 16 KiB, Go 1 MiB): room for large cookies and
# tokens, and far from what a client needs to send to cost the server memory.
MAX_HEAD_BYTES = 32 * 1024


def _too_large(limit: int) -> bytes:
    """431 in OpenAI's error shape, for a head that does not end within `limit` bytes."""
    message = f"The request line and headers must end within {limit} bytes"
    body = orjson.dumps(error_body(message, "invalid_request_error", "request_header_fields_too_large"))
    head = "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class OneWritePerTurn:
    """A transport whose writes of one turn of the event loop go out together, at its end; every
    other method is the transport's own (closing writes what is held first)."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.write_held)
        self._held.append(data)

    def write_held(self) -> None:
        held = self._held
        if not held:
            return
        data = held[0] if len(held) == 1 else b"".join(held)
        held.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.write_held()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Pending:
    """How many connections of one server are waiting for a request head."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0


def guarded_protocol(
    header_timeout_s: float,
    max_pending: int,
    logger: logging.Logger | None = None,
    max_head_bytes: int = MAX_HEAD_BYTES,
) -> type[HttpToolsProtocol]:
    """The httptools protocol of uvicorn, closing a connection whose request head does not arrive
    within `header_timeout_s` or `max_head_bytes`, and refusing new connections while
    `max_pending` are waiting. `logger`: where its connections and requests log (uvicorn's own
    log when None)."""
    pending = _Pending(max_pending)
    too_large = _too_large(max_head_bytes)

    class GuardedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if logger is not None:
                self.logger = logger
            self._head_timer: asyncio.TimerHandle | None = None
            self._awaiting_head = False
            self._writes: OneWritePerTurn | None = None
            # Bytes a head may still take; None while a body is read (the body has its own limits).
            self._head_room: int | None = max_head_bytes

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if pending.count >= pending.limit:
                transport.write(_BUSY)
                transport.close()
                return
            self.transport = self._writes = OneWritePerTurn(transport, self.loop)  # type: ignore[assignment]
            self._await_head()  # from the connect: a client that sends nothing is cut as well

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._awaiting_head:
                self._await_head()  # the next request on a kept-alive connection

        def data_received(self, data: bytes) -> None:
            while data and not self.transport.is_closing():
                room = self._head_room
                if room == 0:  # the head is at the cap and has not ended
                    self._refuse_head()
                    return
                if room is None or len(data) <= room:
                    if room is not None:
                        self._head_room = room - len(data)
                    super().data_received(data)
                    return
                # Only what the head may still take; the parser's callbacks say where it ended.
                piece, data = data[:room], data[room:]
                self._head_room = 0
                super().data_received(piece)

        def on_headers_complete(self) -> None:
            self._head_room = None
            self._head_arrived()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_room = max_head_bytes  # the next request on the connection starts its head

        def _refuse_head(self) -> None:
            # Not in the middle of another response (a pipelined request): then only the close.
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(too_large)
            self.transport.close()

        def on_response_complete(self) -> None:
            if self._writes is not None:
                self._writes.write_held()  # the response's last bytes: nothing else will join them
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_arrived()
            super().connection_lost(exc)

        def _await_head(self) -> None:
            self._awaiting_head = True
            pending.count += 1
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _head_arrived(self) -> None:
            if self._awaiting_head:
                self._awaiting_head = False
                pending.count -= 1
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedProtocol
