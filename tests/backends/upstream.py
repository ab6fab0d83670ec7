"""Stand-ins for a model server, and the wire helpers to script one, for the backend tests."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.core.chunks import Chunk
from gateway.settings import DeploymentSettings

DEPLOYMENT = DeploymentSettings(name="d", api_base="http://upstream.test/v1", model="m")

Respond = Callable[["asyncio.StreamWriter", int], Awaitable[None]]


class FakeUpstream:
    """A tiny keep-alive HTTP/1.1 server; `respond(writer, n)` answers its n-th request (from 0)."""

    def __init__(self, respond: Respond, tls: ssl.SSLContext | None = None) -> None:
        self._respond = respond
        self._tls = tls
        self.connections = 0
        self.a_connection_closed = asyncio.Event()  # by either side
        self.bodies: list[dict[str, Any]] = []  # {} for a request without a body
        self.heads: list[bytes] = []
        self.url = ""

    async def __aenter__(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}/v1"
        return self

    async def __aexit__(self, *_: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while not writer.is_closing():
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                self.heads.append(head)
                body = await reader.readexactly(int(length.group(1))) if length else b""
                self.bodies.append(orjson.loads(body) if body else {})
                await self._respond(writer, len(self.bodies) - 1)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            self.a_connection_closed.set()
            writer.close()


def sse(*events: object, done: bool = True) -> bytes:
    body = b"".join(b"data: " + (e if isinstance(e, bytes) else orjson.dumps(e)) + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


def chunk(content: str) -> dict[str, object]:
    return {"id": "x", "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}


def http_chunked(body: bytes, *, headers: bytes = b"") -> bytes:
    """A 200 with the body as chunks of one SSE event each, as model servers send it."""
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    return head + headers + b"\r\n" + chunks + b"0\r\n\r\n"


def http_fixed(status: str, body: bytes, headers: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-length: %d\r\n%s\r\n%s" % (status.encode(), len(body), headers, body)


def answer(payload: bytes) -> Respond:
    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(payload)
        await writer.drain()

    return respond


def direct(url: str, **timeouts: float) -> OpenAICompatBackend:
    deployment = DEPLOYMENT.model_copy(
        update={"api_base": url, "timeouts": DEPLOYMENT.timeouts.model_copy(update=timeouts)}
    )
    return OpenAICompatBackend(deployment)


def unjoined(chunks: list[Chunk]) -> list[Chunk]:
    """The chunks one by one as a streaming client gets them: a joined chunk's pieces (coalesce.py)
    become the plain content chunks they came from."""
    return [one for c in chunks for one in ([Chunk(content=p) for p in c.pieces] if c.pieces else [c])]
