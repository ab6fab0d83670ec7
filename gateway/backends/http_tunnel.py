"""A CONNECT tunnel through an HTTP proxy: what an https upstream behind HTTPS_PROXY is reached by.

The proxy is asked once; its 2xx answer leaves a raw byte pipe to the origin, over which the
transport runs TLS as if it had connected directly. Failures are `OSError`s, which the pool
reports as a failed connect, as it does a refused socket or a failed handshake.
"""

from __future__ import annotations

import asyncio

_MAX_HEAD_BYTES = 16 * 1024  # a proxy's answer to CONNECT is a status line and a few headers


class _TunnelSetup(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT; nothing else arrives before TLS starts."""

    def __init__(self, answered: asyncio.Future[int]) -> None:
        self._answered = answered
        self._head = b""

    def data_received(self, data: bytes) -> None:
        if self._answered.done():
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end >= 0:
            try:
                self._answered.set_result(_status(self._head[:end]))
            except ConnectionError as exc:
                self._answered.set_exception(exc)
        elif len(self._head) > _MAX_HEAD_BYTES:
            self._answered.set_exception(ConnectionError("the proxy's answer to CONNECT is too large"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._answered.done():
            self._answered.set_exception(ConnectionResetError(f"the proxy closed the connection: {exc!r}"))


def _status(head: bytes) -> int:
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ConnectionError(f"the proxy answered CONNECT with {head[:100]!r}")
    return int(parts[1])


async def open_tunnel(loop: asyncio.AbstractEventLoop, host: str, port: int, head: bytes) -> asyncio.Transport:
    """The proxy's transport once it has agreed to `head` (a CONNECT request); the caller times it."""
    answered: asyncio.Future[int] = loop.create_future()
    transport, _ = await loop.create_connection(lambda: _TunnelSetup(answered), host, port)
    try:
        transport.write(head)
        status = await answered
        if not 200 <= status < 300:
            raise ConnectionRefusedError(f"the proxy answered CONNECT with status {status}")
    except BaseException:
        transport.close()
        raise
    return transport
