"""A minimal, very fast OpenAI-compatible upstream for the overhead benchmark.

`python bench/support/fast_upstream.py [--port 0] [--chunks 20]` prints
`upstream listening on http://127.0.0.1:PORT/v1` once it accepts connections.

It is a raw asyncio protocol with the httptools parser on uvloop, and every reply is rendered once
at start: it has to cost far less per request than the proxies it is measured through, or the
benchmark would measure this server. Streams are written in one go (no sleeps), so whatever gap
a client sees between chunks is the cost of what sits between it and this server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from dataclasses import dataclass
from typing import Any, cast

import httptools
import orjson
import uvloop

MODEL = "fast"
TOKEN = "tok "
CREATED = 1_700_000_000
_COMPLETION_ID = "chatcmpl-bench"
_JSON = b"application/json"


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type
    return head + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def _chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": _COMPLETION_ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _usage(chunks: int) -> dict[str, int]:
    return {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks}


def completion_body(chunks: int) -> bytes:
    message = {"role": "assistant", "content": TOKEN * chunks}
    return orjson.dumps(
        {
            "id": _COMPLETION_ID,
            "object": "chat.completion",
            "created": CREATED,
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": _usage(chunks),
        }
    )


def stream_events(chunks: int, include_usage: bool) -> list[bytes]:
    """The SSE events of a stream: N content chunks, the finish chunk, usage if asked, [DONE]."""
    # The role rides on the first content chunk so that every one of the N chunks carries text.
    payloads = [_chunk({"role": "assistant", "content": TOKEN}, None)]
    payloads += [_chunk({"content": TOKEN}, None) for _ in range(chunks - 1)]
    payloads.append(_chunk({}, "stop"))
    if include_usage:
        payloads.append({**_chunk({}, None), "choices": [], "usage": _usage(chunks)})
    return [b"data: " + orjson.dumps(p) + b"\n\n" for p in payloads] + [b"data: [DONE]\n\n"]


def _chunked_stream(events: list[bytes]) -> bytes:
    # Chunked transfer encoding, one HTTP chunk per event, as a real model server sends it.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


@dataclass(frozen=True)
class Replies:
    """Every response this server can give, rendered once, headers included."""

    models: bytes
    completion: bytes
    stream_with_usage: bytes
    stream_without_usage: bytes
    not_found: bytes
    bad_request: bytes

    @classmethod
    def render(cls, chunks: int) -> Replies:
        models = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "b"}]}
        error = {"error": {"message": "not found", "type": "invalid_request_error"}}
        return cls(
            models=_response(b"200 OK", _JSON, orjson.dumps(models)),
            completion=_response(b"200 OK", _JSON, completion_body(chunks)),
            stream_with_usage=_chunked_stream(stream_events(chunks, include_usage=True)),
            stream_without_usage=_chunked_stream(stream_events(chunks, include_usage=False)),
            not_found=_response(b"404 Not Found", _JSON, orjson.dumps(error)),
            bad_request=_response(b"400 Bad Request", _JSON, b'{"error":{"message":"bad request"}}'),
        )

    def pick(self, method: bytes, path: bytes, body: bytes) -> bytes:
        if method == b"GET" and path == b"/v1/models":
            return self.models
        if method != b"POST" or path != b"/v1/chat/completions":
            return self.not_found
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self.bad_request
        if not isinstance(payload, dict) or payload.get("stream") is not True:
            return self.completion
        options = payload.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        return self.stream_with_usage if with_usage else self.stream_without_usage


class UpstreamProtocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; the httptools parser calls the `on_*` methods."""

    def __init__(self, replies: Replies) -> None:
        self._replies = replies
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, though they implement it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.write(self._replies.bad_request)
                self._transport.close()

    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        path = self._url.split(b"?", 1)[0]
        self._transport.write(self._replies.pick(self._parser.get_method(), path, b"".join(self._body)))
        if not self._parser.should_keep_alive():
            self._transport.close()


async def serve(host: str, port: int, chunks: int) -> None:
    replies = Replies.render(chunks)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))  # bound before listening so that port 0 works and the printed URL is real
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: UpstreamProtocol(replies), sock=sock, backlog=2048)
    bound_host, bound_port = sock.getsockname()[:2]
    print(f"upstream listening on http://{bound_host}:{bound_port}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=20, help="content chunks per stream")
    args = parser.parse_args()
    if args.chunks < 1:
        parser.error("--chunks must be at least 1")
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, args.chunks))


if __name__ == "__main__":
    main()
