"""A cheap closed-loop load generator: one raw keep-alive HTTP/1.1 connection per concurrent worker.

It is an asyncio protocol with the httptools response parser rather than httpx or asyncio
streams, because on a 2-core machine every microsecond the load generator spends is a
microsecond taken from the process being measured. A request is the same pre-rendered bytes each
time; a response is timed on arrival (`data_received`), and for streams every SSE event that
carries content is timestamped, which gives time to first content chunk and the gaps between
chunks.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import cast

import httptools

# One match per SSE event whose delta carries non-empty text; allows a space after the colon.
CHAT_CONTENT = re.compile(rb'"content":\s*"(?!")')  # a chat chunk with text
RESPONSES_CONTENT = re.compile(rb'"type":"response\.output_text\.delta"')  # a Responses text delta
MESSAGES_CONTENT = re.compile(rb'"type":"text_delta"')  # a Messages API text delta
_EVENT_END = b"\n\n"


class RequestFailed(Exception):
    pass


@dataclass(frozen=True)
class Spec:
    """What one window sends and what a correct answer looks like."""

    host: str
    port: int
    request: bytes  # the whole HTTP request, rendered once
    stream: bool
    expect_chunks: int  # content chunks a correct stream has
    expect_text: bytes  # text a correct non-streaming body contains
    content: re.Pattern[bytes] = CHAT_CONTENT  # one match per content chunk of a stream


def render_request(
    host: str, port: int, path: str, api_key: str, body: bytes, headers: Sequence[tuple[str, str]] = ()
) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {api_key}\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(slots=True)
class Sample:
    latency_s: float
    chunk_times_s: list[float]  # arrival of each content chunk, from the request's start

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None


class _Client(asyncio.Protocol):
    """One connection, one request in flight; httptools calls the `on_*` methods."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._stream = False
        self._content = CHAT_CONTENT
        self._started = 0.0
        self._now = 0.0
        self._pending = b""
        self.body: list[bytes] = []
        self.chunk_times: list[float] = []
        self.status = 0
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports implement it

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(RequestFailed(f"connection lost: {exc!r}"))

    def data_received(self, data: bytes) -> None:
        self._now = time.perf_counter()  # one clock read per read; every event in it arrived then
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.reusable = False
            self._fail(RequestFailed(f"bad response: {exc!r}"))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self._stream:
            self.body.append(body)
            return
        pending = self._pending + body
        end = pending.rfind(_EVENT_END)
        if end < 0:
            self._pending = pending
            return
        complete, self._pending = pending[: end + 2], pending[end + 2 :]
        found = len(self._content.findall(complete))
        if found:
            self.chunk_times.extend([self._now - self._started] * found)

    def on_message_complete(self) -> None:
        if not self._parser.should_keep_alive():
            self.reusable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    async def send(self, request: bytes, stream: bool, content: re.Pattern[bytes] = CHAT_CONTENT) -> float:
        """Send one request and wait for its whole response; return its latency in seconds."""
        if self.transport is None or not self.reusable:
            raise RequestFailed("connection not reusable")
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._stream, self._pending, self.body, self.chunk_times = stream, b"", [], []
        self._content = content
        self._started = time.perf_counter()
        self.transport.write(request)
        await self._waiter
        return self._now - self._started


async def _connect(host: str, port: int) -> _Client:
    _, client = await asyncio.get_running_loop().create_connection(_Client, host, port)
    return client


def _check(client: _Client, spec: Spec) -> None:
    if client.status != 200:
        raise RequestFailed(f"status {client.status}")
    if spec.stream and len(client.chunk_times) != spec.expect_chunks:
        raise RequestFailed(f"{len(client.chunk_times)} content chunks, expected {spec.expect_chunks}")
    if not spec.stream and spec.expect_text not in b"".join(client.body):
        raise RequestFailed("reply text missing")


@dataclass
class Window:
    """The outcome of one bounded stretch of load."""

    samples: list[Sample] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0


class Pool:
    """`concurrency` workers, each with its own connection, sending back to back (a closed loop)."""

    def __init__(self, spec: Spec, clients: list[_Client], timeout_s: float) -> None:
        self._spec = spec
        self._clients = clients
        self._timeout_s = timeout_s

    @classmethod
    @asynccontextmanager
    async def open(cls, spec: Spec, concurrency: int, timeout_s: float = 30.0) -> AsyncIterator[Pool]:
        # Connections are opened before any window, so connecting is never part of a measurement.
        async with asyncio.timeout(timeout_s):
            clients = list(await asyncio.gather(*(_connect(spec.host, spec.port) for _ in range(concurrency))))
        try:
            yield cls(spec, clients, timeout_s)
        finally:
            for client in clients:
                if client.transport is not None:
                    client.transport.close()

    async def run(self, requests: int, time_cap_s: float) -> Window:
        """Send `requests` requests, or as many as start within `time_cap_s`; in-flight ones finish."""
        window = Window()
        budget = _Budget(requests, time.perf_counter() + time_cap_s)
        started = time.perf_counter()
        await asyncio.gather(*(self._worker(i, budget, window) for i in range(len(self._clients))))
        window.elapsed_s = time.perf_counter() - started
        return window

    async def _worker(self, index: int, budget: _Budget, window: Window) -> None:
        while budget.take():
            client = self._clients[index]
            try:
                async with asyncio.timeout(self._timeout_s):
                    if not client.reusable:
                        client = self._clients[index] = await _connect(self._spec.host, self._spec.port)
                    latency = await client.send(self._spec.request, self._spec.stream, self._spec.content)
                _check(client, self._spec)
            except (RequestFailed, OSError, TimeoutError) as exc:
                window.errors[str(exc)[:120] or type(exc).__name__] += 1
                client.reusable = False  # its state is unknown now: the next request reconnects
                if client.transport is not None:
                    client.transport.close()
                continue
            window.samples.append(Sample(latency, client.chunk_times))


class _Budget:
    def __init__(self, requests: int, deadline: float) -> None:
        self._left = requests
        self._deadline = deadline

    def take(self) -> bool:
        if self._left <= 0 or time.perf_counter() > self._deadline:
            return False
        self._left -= 1
        return True
