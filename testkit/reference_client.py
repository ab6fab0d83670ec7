"""A minimal streaming chat client written from first principles, to cross-check `gateway replay`.

Nothing of replay's stack is shared: raw non-blocking sockets, one `selectors` loop in the calling
thread, HTTP/1.1 keep-alive with chunked decoding and SSE parsing by hand. One connection per
worker (a closed loop of `concurrency` workers). For each request the clock is read immediately
before the first byte of the request is written; TTFT is the read that completes the first event
carrying content or a tool-call delta, E2E the read that completes `data: [DONE]`.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

_READ_BYTES = 65536


@dataclass(slots=True)
class Measured:
    key: str
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens: int | None = None
    finish_reason: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or not self.tokens or self.tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.tokens - 1)


class _Response:
    """Incremental parser of one chunked SSE response; `feed` returns True once it is complete."""

    def __init__(self, measured: Measured, sent: float) -> None:
        self.measured, self._sent = measured, sent
        self._raw = b""
        self._headers_done = False
        self._chunk_left: int | None = None  # bytes of the current chunk still to come (+2 for CRLF)
        self._sse = b""
        self._ended = False

    def feed(self, data: bytes, now: float) -> bool:
        self._raw += data
        if not self._headers_done:
            head, sep, rest = self._raw.partition(b"\r\n\r\n")
            if not sep:
                return False
            status = head.split(b" ", 2)[1]
            if status != b"200" or b"transfer-encoding: chunked" not in head.lower():
                raise AssertionError(f"reference client expects a chunked 200 stream, got {head[:200]!r}")
            self._headers_done, self._raw = True, rest
        return self._dechunk(now)

    def _dechunk(self, now: float) -> bool:
        while True:
            if self._chunk_left is None:
                line, sep, rest = self._raw.partition(b"\r\n")
                if not sep:
                    return False
                size = int(line.split(b";")[0], 16)
                self._raw, self._chunk_left = rest, size + 2
                if size == 0:
                    self._ended = True
            if len(self._raw) < self._chunk_left:
                return False
            payload = self._raw[: self._chunk_left - 2]
            self._raw, self._chunk_left = self._raw[self._chunk_left :], None
            if self._ended:
                return True
            self._events(payload, now)

    def _events(self, payload: bytes, now: float) -> None:
        self._sse += payload
        while b"\n\n" in self._sse:
            event, self._sse = self._sse.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    self._data(line[6:], now)

    def _data(self, data: bytes, now: float) -> None:
        measured = self.measured
        if data == b"[DONE]":
            measured.e2e_s = now - self._sent
            return
        chunk: dict[str, Any] = orjson.loads(data)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            measured.tokens = usage.get("completion_tokens")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if measured.ttft_s is None and (delta.get("content") or delta.get("tool_calls")):
                measured.ttft_s = now - self._sent
            if choice.get("finish_reason"):
                measured.finish_reason = choice["finish_reason"]


class _Worker:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.response: _Response | None = None


def run_reference(url: str, bodies: list[tuple[str, bytes]], concurrency: int, timeout_s: float) -> list[Measured]:
    """Send every (key, body) with `concurrency` workers; raises if not done within `timeout_s`."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path.rstrip("/") + "/chat/completions"
    pending = deque(bodies)
    results: list[Measured] = []
    selector = selectors.DefaultSelector()
    workers = [_Worker(host, port) for _ in range(min(concurrency, len(bodies)))]
    deadline = time.monotonic() + timeout_s
    try:
        for worker in workers:
            _start(worker, pending, host, port, path, results, selector)
        while any(worker.response is not None for worker in workers):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"reference client: {len(bodies) - len(results)} requests unfinished")
            for key, _ in selector.select(min(left, 1.0)):
                worker = key.data
                now = time.perf_counter()
                data = worker.sock.recv(_READ_BYTES)
                if not data:
                    raise ConnectionError("reference client: the server closed a keep-alive connection")
                assert worker.response is not None
                if worker.response.feed(data, now):
                    selector.unregister(worker.sock)
                    worker.response = None
                    _start(worker, pending, host, port, path, results, selector)
    finally:
        selector.close()
        for worker in workers:
            worker.sock.close()
    return results


def _start(
    worker: _Worker,
    pending: deque[tuple[str, bytes]],
    host: str,
    port: int,
    path: str,
    results: list[Measured],
    selector: selectors.BaseSelector,
) -> None:
    if not pending:
        return
    key, body = pending.popleft()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    measured = Measured(key)
    results.append(measured)
    sent = time.perf_counter()  # before the first byte is written
    written = worker.sock.send(request)
    if written != len(request):
        raise AssertionError("reference client: the request did not fit the socket buffer in one write")
    worker.response = _Response(measured, sent)
    selector.register(worker.sock, selectors.EVENT_READ, worker)


def main(argv: list[str]) -> None:
    """`python -m testkit.reference_client URL BODIES.json CONCURRENCY OUT.json`: the same
    client as a process of its own, so it can run alongside replay without sharing its interpreter."""
    url, bodies_path, concurrency, out_path = argv
    bodies = [(key, body.encode()) for key, body in orjson.loads(Path(bodies_path).read_bytes())]
    results = run_reference(url, bodies, int(concurrency), timeout_s=120)
    Path(out_path).write_bytes(orjson.dumps([asdict(result) for result in results]))


if __name__ == "__main__":
    main(sys.argv[1:])
