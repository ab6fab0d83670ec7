"""The HTTP transport replay measures through: httpx over httpcore, with each request written to the
socket in one piece.

httpcore writes a request's headers and its body separately, yielding to the event loop before each
write. On a busy machine the headers' write wakes the server, which may take the CPU, and the body
follows later: the server only has the request once the body is there, so the gap lands inside
TTFT. A reference client that writes the request in one send does not pay it. `Coalescing` holds the
first write of each request (the headers) and sends it with the next (the body), or before the next
read when a request has no body, so the request reaches the socket in one write.

httpx does not take a network backend, so the transport swaps its connection pool for one built
with `httpcore.AsyncConnectionPool`'s public `network_backend` argument; httpx is pinned. The
methods keep httpcore's signatures, `timeout` arguments included (hence the ASYNC109 exemptions).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

SocketOption = Any  # httpcore's SOCKET_OPTION union; not exported


class _CoalescingStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._held = b""
        self._hold_next = True  # the next write starts a request: its headers

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if self._hold_next and buffer:
            self._held, self._hold_next = buffer, False
            return
        data, self._held = self._held + buffer, b""
        if data:
            await self._inner.write(data, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        if self._held:
            data, self._held = self._held, b""
            await self._inner.write(data, timeout)
        self._hold_next = True
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        return _CoalescingStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class Coalescing(httpcore.AsyncNetworkBackend):
    """httpcore's default network backend, with each request written in one piece."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _CoalescingStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _CoalescingStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def coalescing_transport(tls: ssl.SSLContext, connections: int) -> httpx.AsyncHTTPTransport:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    transport = httpx.AsyncHTTPTransport(verify=tls, limits=limits)
    transport._pool = httpcore.AsyncConnectionPool(  # see the module docstring
        ssl_context=tls,
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=Coalescing(),
    )
    return transport
