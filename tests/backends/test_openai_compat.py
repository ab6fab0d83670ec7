"""The OpenAI-compatible backend: wire handling and error translation, over httpx's MockTransport and
over the gateway's own HTTP/1.1 client against a real socket (connection reuse, deadlines, cuts)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from gateway.backends.base import BackendRequest, Chunk
from gateway.backends.http_transport import RequestTemplate
from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.errors import (
    UpstreamConnectError,
    UpstreamInBandError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import Continuation, DeploymentSettings

DEPLOYMENT = DeploymentSettings(name="d", api_base="http://upstream.test/v1", model="m")


def sse(*events: object, done: bool = True) -> bytes:
    body = b"".join(b"data: " + (e if isinstance(e, bytes) else orjson.dumps(e)) + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


def chunk(content: str) -> dict[str, object]:
    return {"id": "x", "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}


def backend(handler: Callable[[httpx.Request], httpx.Response]) -> OpenAICompatBackend:
    client = httpx.AsyncClient(base_url=DEPLOYMENT.api_base, transport=httpx.MockTransport(handler))
    return OpenAICompatBackend(DEPLOYMENT, client)


async def collect(b: OpenAICompatBackend, body: dict[str, object] | None = None) -> list[Chunk]:
    request = BackendRequest(body=body or {"model": "m", "messages": []})
    return [c async for c in b.stream(request)]


async def test_upstream_is_always_asked_to_stream_with_usage_and_unknown_fields_pass() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return httpx.Response(200, content=sse(chunk("hi")))

    await collect(backend(handler), {"model": "m", "messages": [], "stream": False, "vendor_knob": [1, 2]})
    assert seen[0]["stream"] is True
    assert seen[0]["stream_options"] == {"include_usage": True}
    assert seen[0]["vendor_knob"] == [1, 2]


async def test_chunks_are_normalized_and_unknown_fields_kept() -> None:
    raw = {
        "id": "x",
        "system_fingerprint": "fp",
        "choices": [{"index": 0, "delta": {"content": "a", "vendor": 1}, "logprobs": {"content": []}}],
    }
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}
    chunks = await collect(backend(lambda _: httpx.Response(200, content=sse(raw, usage))))
    assert chunks[0].content == "a"
    assert chunks[0].delta_extra == {"vendor": 1}
    assert chunks[0].choice_extra == {"logprobs": {"content": []}}
    assert chunks[0].extra == {"system_fingerprint": "fp"}
    assert chunks[1].usage is not None
    assert chunks[1].usage.total_tokens == 3


async def test_a_vllm_deployment_is_asked_for_running_usage_which_becomes_a_token_count() -> None:
    # vLLM merges tokens into one chunk when its reader lags: the running usage on each chunk is
    # the only exact count of what was sent (a continuation's max_tokens, a failed attempt's usage).
    seen: list[dict[str, Any]] = []
    running = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    final = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return httpx.Response(200, content=sse({**chunk("abc"), "usage": running}, final))

    vllm = DEPLOYMENT.model_copy(update={"continuation": Continuation.VLLM})
    client = httpx.AsyncClient(base_url=vllm.api_base, transport=httpx.MockTransport(handler))
    chunks = [c async for c in OpenAICompatBackend(vllm, client).stream(BackendRequest({"model": "m"}))]
    assert seen[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (chunks[0].content, chunks[0].tokens, chunks[0].usage) == ("abc", 3, None)  # not usage to add up
    assert chunks[1].usage is not None
    assert chunks[1].usage.total_tokens == 8


async def test_stream_without_done_is_a_protocol_error() -> None:
    b = backend(lambda _: httpx.Response(200, content=sse(chunk("a"), done=False)))
    with pytest.raises(UpstreamProtocolError, match="before \\[DONE\\]"):
        await collect(b)


async def test_malformed_chunk_is_a_protocol_error() -> None:
    b = backend(lambda _: httpx.Response(200, content=sse(chunk("a"), b"{oops")))
    with pytest.raises(UpstreamProtocolError, match="malformed"):
        await collect(b)


async def test_error_event_inside_a_200_stream_is_an_in_band_error() -> None:
    b = backend(lambda _: httpx.Response(200, content=sse(chunk("a"), {"error": {"message": "GPU fell over"}})))
    with pytest.raises(UpstreamInBandError, match="GPU fell over"):
        await collect(b)


async def test_error_status_keeps_the_upstream_message_and_retry_after() -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"error": {"message": "slow down"}}, headers={"Retry-After": "2"})

    with pytest.raises(UpstreamStatusError) as raised:
        await collect(backend(handler))
    assert raised.value.upstream_status == 429
    assert raised.value.retry_after_s == 2.0
    assert raised.value.retryable
    assert "slow down" in raised.value.message


async def test_connect_failure_is_translated() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(UpstreamConnectError):
        await collect(backend(handler))


async def test_keep_alive_comments_and_crlf_lines_are_understood() -> None:
    body = b": keep-alive\r\n\r\ndata: " + orjson.dumps(chunk("a")) + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    chunks = await collect(backend(lambda _: httpx.Response(200, content=body)))
    assert [c.content for c in chunks] == ["a"]


async def test_the_body_is_read_as_the_sse_standard_says() -> None:
    """A chunk over two `data:` lines (joined with LF), CR line ends, a BOM, no space after the
    colon, an event name; a last event whose blank line never came still counts as said."""
    head, tail = orjson.dumps(chunk("a"))[:10], orjson.dumps(chunk("a"))[10:]
    body = b"\xef\xbb\xbf: hi\r\revent: delta\rdata:" + head + b"\rdata: " + tail + b"\r\rdata: [DONE]\r"
    chunks = await collect(backend(lambda _: httpx.Response(200, content=body)))
    assert [c.content for c in chunks] == ["a"]


async def test_a_line_that_never_ends_is_a_protocol_error_not_unbounded_memory() -> None:
    """A peer sends one `data:` line and keeps it going: the reader's bound ends it."""

    async def endless() -> AsyncIterator[bytes]:
        yield b"data: "
        for _ in range(20):  # 20 x 1 MiB: past the 16 MiB bound
            yield b"x" * (1 << 20)

    with pytest.raises(UpstreamProtocolError, match="more than 16777216 bytes"):
        await collect(backend(lambda _: httpx.Response(200, content=endless())))


async def test_no_first_token_within_the_deadline_is_a_first_token_timeout() -> None:
    async def never() -> AsyncIterator[bytes]:
        yield b": waiting\n\n"
        await __import__("asyncio").Event().wait()

    deployment = DEPLOYMENT.model_copy(
        update={"timeouts": DEPLOYMENT.timeouts.model_copy(update={"first_token_s": 0.05})}
    )
    client = httpx.AsyncClient(
        base_url=deployment.api_base,
        transport=httpx.MockTransport(lambda _: httpx.Response(200, content=never())),
    )
    with pytest.raises(UpstreamTimeout) as raised:
        await collect(OpenAICompatBackend(deployment, client))
    assert raised.value.phase == "first_token"


# --- The direct path: the gateway's own HTTP/1.1 client against a real socket ---------------------

Respond = Callable[["asyncio.StreamWriter", int], Awaitable[None]]


class FakeUpstream:
    """A tiny keep-alive HTTP/1.1 server; `respond(writer, n)` answers its n-th request (from 0)."""

    def __init__(self, respond: Respond) -> None:
        self._respond = respond
        self.connections = 0
        self.bodies: list[dict[str, Any]] = []
        self.heads: list[bytes] = []
        self.url = ""

    async def __aenter__(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *_: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while not writer.is_closing():
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                self.heads.append(head)
                self.bodies.append(orjson.loads(await reader.readexactly(length)))
                await self._respond(writer, len(self.bodies) - 1)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


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
    b = OpenAICompatBackend(deployment)
    assert b._direct is not None  # the plain http URL takes the gateway's own client
    return b


async def test_one_upstream_connection_serves_sequential_requests() -> None:
    async with FakeUpstream(answer(http_chunked(sse(chunk("a"), chunk("b"))))) as upstream:
        b = direct(upstream.url)
        for _ in range(5):
            assert [c.content for c in await collect(b)] == ["a", "b"]
        await b.aclose()
    assert upstream.connections == 1
    assert len(upstream.bodies) == 5
    assert upstream.bodies[0]["stream"] is True
    assert upstream.bodies[0]["stream_options"] == {"include_usage": True}
    assert b"POST /v1/chat/completions HTTP/1.1" in upstream.heads[0]


async def test_body_end_after_done_is_drained_in_the_background_and_the_connection_kept() -> None:
    # uvicorn writes the last chunk separately: the answer must not wait for it, nor lose the connection.
    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(http_chunked(sse(chunk("a")))[: -len(b"0\r\n\r\n")])
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"0\r\n\r\n")

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        started = time.monotonic()
        assert [c.content for c in await collect(b)] == ["a"]
        assert time.monotonic() - started < 0.15
        await asyncio.sleep(0.3)
        await collect(b)
        await b.aclose()
    assert upstream.connections == 1


async def test_direct_error_status_keeps_message_retry_after_and_the_connection() -> None:
    error = http_fixed("429 Too Many Requests", b'{"error": {"message": "slow down"}}', b"retry-after: 2\r\n")

    async def respond(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(error if n == 0 else http_chunked(sse(chunk("a"))))

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        with pytest.raises(UpstreamStatusError) as raised:
            await collect(b)
        assert (raised.value.upstream_status, raised.value.retry_after_s) == (429, 2.0)
        assert "slow down" in raised.value.message
        assert [c.content for c in await collect(b)] == ["a"]
        await b.aclose()
    assert upstream.connections == 1


async def test_direct_stream_cut_is_a_protocol_error_and_is_not_retried() -> None:
    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(http_chunked(sse(chunk("a"), chunk("b")))[:-40])
        await writer.drain()
        writer.close()

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        with pytest.raises(UpstreamProtocolError, match="stream cut"):
            await collect(b)
        await b.aclose()
    assert len(upstream.bodies) == 1


@pytest.mark.parametrize(
    ("body", "error", "match"),
    [
        (sse(chunk("a"), done=False), UpstreamProtocolError, "before \\[DONE\\]"),
        (sse(chunk("a"), b"{oops"), UpstreamProtocolError, "malformed"),
        (sse(chunk("a"), {"error": {"message": "GPU fell over"}}), UpstreamInBandError, "GPU fell over"),
    ],
)
async def test_direct_bad_streams_are_translated(body: bytes, error: type[Exception], match: str) -> None:
    async with FakeUpstream(answer(http_chunked(body))) as upstream:
        b = direct(upstream.url)
        with pytest.raises(error, match=match):
            await collect(b)
        await b.aclose()


async def test_stale_keep_alive_connection_is_retried_once_on_a_new_one() -> None:
    # The server drops a kept-alive connection as the second request arrives on it: that request
    # was never answered, so it goes again on a fresh connection.
    async def respond(writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            writer.close()
            return
        writer.write(http_chunked(sse(chunk("a"))))

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        await collect(b)
        assert [c.content for c in await collect(b)] == ["a"]
        await b.aclose()
    assert upstream.connections == 2
    assert len(upstream.bodies) == 3


async def test_connection_closed_by_the_server_while_idle_is_not_reused() -> None:
    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(http_chunked(sse(chunk("a"))))
        await writer.drain()
        writer.close()  # keep-alive was not refused: the client learns of the close only from the socket

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        await collect(b)
        await asyncio.sleep(0.05)
        assert [c.content for c in await collect(b)] == ["a"]
        await b.aclose()
    assert (upstream.connections, len(upstream.bodies)) == (2, 2)


async def test_read_until_close_body_and_gzip_encoding_are_understood() -> None:
    compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    body = compressor.compress(sse(chunk("a"), chunk("b"))) + compressor.flush()
    head = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\nconnection: close\r\n\r\n"

    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(head + body[:10])
        await writer.drain()
        writer.write(body[10:])
        writer.close()

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        for _ in range(2):
            assert [c.content for c in await collect(b)] == ["a", "b"]
        await b.aclose()
    assert upstream.connections == 2


async def test_bytes_after_the_response_leave_it_whole_and_the_connection_unused() -> None:
    stray = http_chunked(sse(chunk("stray")))
    async with FakeUpstream(answer(http_chunked(sse(chunk("a"))) + stray)) as upstream:
        b = direct(upstream.url)
        for _ in range(2):
            assert [c.content for c in await collect(b)] == ["a"]
        await b.aclose()
    assert upstream.connections == 2


async def test_direct_keep_alive_comments_and_crlf_lines_split_anywhere_are_understood() -> None:
    body = b": keep-alive\r\n\r\ndata: " + orjson.dumps(chunk("a")) + b"\r\n\r\ndata: [DONE]\r\n\r\n"

    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 7):
            writer.write(body[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0.001)

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        assert [c.content for c in await collect(b)] == ["a"]
        await b.aclose()


def stalling(first: bytes) -> Respond:
    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(first), first))
        await asyncio.sleep(10)

    return respond


@pytest.mark.parametrize(
    ("first", "phase"),
    [(b": waiting\n\n", "first_token"), (b"data: " + orjson.dumps(chunk("a")) + b"\n\n", "stall")],
)
async def test_direct_deadlines_name_their_phase(first: bytes, phase: str) -> None:
    async with FakeUpstream(stalling(first)) as upstream:
        b = direct(upstream.url, first_token_s=0.1, stall_s=0.1)
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout) as raised:
            await collect(b)
        assert raised.value.phase == phase
        assert time.monotonic() - started < 1
        await b.aclose()


def paced(delays: list[float]) -> Respond:
    """A stream whose i-th content chunk is written `delays[i]` seconds after the previous one."""

    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for i, delay in enumerate(delays):
            await asyncio.sleep(delay)
            event = sse(chunk(str(i)), done=i == len(delays) - 1)
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"0\r\n\r\n")

    return respond


async def test_time_with_the_consumer_is_not_a_stall_even_across_tasks() -> None:
    # Chunk 1 comes 0.35 s after chunk 0, which the consumer held for 0.25 s: only 0.1 s of
    # that is the upstream's, within the 0.2 s stall deadline.
    async with FakeUpstream(paced([0, 0.35])) as upstream:
        b = direct(upstream.url, first_token_s=0.2, stall_s=0.2)
        chunks = b.stream(BackendRequest(body={"model": "m", "messages": []}))
        first = await asyncio.create_task(anext(chunks))  # peeked by one task, as the HTTP layer does

        async def rest() -> list[str | None]:
            await asyncio.sleep(0.25)  # a slow client
            return [c.content async for c in chunks]

        assert [first.content, *await asyncio.create_task(rest())] == ["0", "1"]
        await b.aclose()


async def test_a_steady_stream_longer_than_the_stall_deadline_is_not_a_stall() -> None:
    async with FakeUpstream(paced([0.08] * 6)) as upstream:
        b = direct(upstream.url, first_token_s=0.2, stall_s=0.2)
        assert [c.content for c in await collect(b)] == [str(i) for i in range(6)]
        await b.aclose()


async def test_direct_error_body_without_a_length_ends_with_the_connection() -> None:
    head = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\n"

    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(head + b'{"error": {"message": "overloaded"}}')
        writer.close()

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        with pytest.raises(UpstreamStatusError, match="overloaded") as raised:
            await collect(b)
        assert raised.value.upstream_status == 503
        await b.aclose()


async def test_direct_connect_refused_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    b = direct(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(UpstreamConnectError):
        await collect(b)
    await b.aclose()


async def test_direct_connect_timeout_is_a_connect_phase_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hang(*_: object, **__: object) -> None:
        await asyncio.sleep(10)

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", hang)
    b = direct("http://127.0.0.1:9/v1", connect_s=0.05)
    with pytest.raises(UpstreamTimeout) as raised:
        await collect(b)
    assert raised.value.phase == "connect"
    await b.aclose()


async def test_requests_wait_for_a_free_connection_at_max_inflight() -> None:
    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        await asyncio.sleep(0.05)
        writer.write(http_chunked(sse(chunk("a"))))

    async with FakeUpstream(respond) as upstream:
        deployment = DEPLOYMENT.model_copy(update={"api_base": upstream.url, "max_inflight": 1})
        b = OpenAICompatBackend(deployment)
        results = await asyncio.gather(*(collect(b) for _ in range(3)))
        assert [[c.content for c in r] for r in results] == [["a"]] * 3
        await b.aclose()
    assert upstream.connections == 1


def test_httpx_stays_where_the_direct_client_does_not_go(monkeypatch: pytest.MonkeyPatch) -> None:
    def route(url: str) -> object:
        return OpenAICompatBackend(DEPLOYMENT.model_copy(update={"api_base": url}))._direct

    assert route("http://upstream.test/v1") is not None
    assert route("http://user:pw@upstream.test/v1") is None
    assert route("http://upstream.test/v1?api-version=1") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    assert route("http://upstream.test/v1") is None
    monkeypatch.setenv("NO_PROXY", "upstream.test")
    assert route("http://upstream.test/v1") is not None


def test_request_headers_cannot_smuggle_lines() -> None:
    template = RequestTemplate("POST", "/v1/chat/completions", "h", {"a": "b"})
    assert template.render(b"{}").startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: h\r\na: b\r\n")
    with pytest.raises(ValueError, match="invalid HTTP header"):
        template.render(b"{}", {"x": "1\r\nevil: 2"})
