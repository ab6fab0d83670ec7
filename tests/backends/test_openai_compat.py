"""The OpenAI-compatible backend over the gateway's own HTTP/1.1 client against a real socket: wire
handling, error translation, connection reuse, deadlines, cuts, and the health probe."""

from __future__ import annotations

import asyncio
import base64
import gc
import socket
import time
import zlib

import orjson
import pytest

from gateway.backends.base import BackendRequest
from gateway.backends.http_transport import ConnectionPool, Origin, RequestTemplate
from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.core.chunks import Chunk
from gateway.errors import (
    UpstreamConnectError,
    UpstreamInBandError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import Continuation, DeploymentSettings
from tests.backends.upstream import (
    DEPLOYMENT,
    FakeUpstream,
    Respond,
    answer,
    chunk,
    direct,
    http_chunked,
    http_fixed,
    sse,
    unjoined,
)


async def collect(b: OpenAICompatBackend, body: dict[str, object] | None = None) -> list[Chunk]:
    """The chunks as a streaming client gets them, one by one (a non-streamed request's are
    joined; a streamed one's are joined too but keep their pieces: see test_coalesce.py)."""
    request = BackendRequest(body=body or {"model": "m", "messages": [], "stream": True})
    return unjoined([c async for c in b.stream(request)])


async def collect_from(
    respond: Respond | bytes, body: dict[str, object] | None = None, deployment: DeploymentSettings = DEPLOYMENT
) -> tuple[list[Chunk], FakeUpstream]:
    """What the backend makes of one scripted response, and what the upstream was sent."""
    async with FakeUpstream(answer(respond) if isinstance(respond, bytes) else respond) as upstream:
        b = OpenAICompatBackend(deployment.model_copy(update={"api_base": upstream.url}))
        try:
            return await collect(b, body), upstream
        finally:
            await b.aclose()


async def test_upstream_is_always_asked_to_stream_with_usage_and_unknown_fields_pass() -> None:
    body: dict[str, object] = {"model": "m", "messages": [], "stream": False, "vendor_knob": [1, 2]}
    _, upstream = await collect_from(http_chunked(sse(chunk("hi"))), body)
    assert upstream.bodies[0]["stream"] is True
    assert upstream.bodies[0]["stream_options"] == {"include_usage": True}
    assert upstream.bodies[0]["vendor_knob"] == [1, 2]


async def test_chunks_are_normalized_and_unknown_fields_kept() -> None:
    raw = {
        "id": "x",
        "system_fingerprint": "fp",
        "choices": [{"index": 0, "delta": {"content": "a", "vendor": 1}, "logprobs": {"content": []}}],
    }
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}
    chunks, _ = await collect_from(http_chunked(sse(raw, usage)))
    assert chunks[0].content == "a"
    assert chunks[0].delta_extra == {"vendor": 1}
    assert chunks[0].choice_extra == {"logprobs": {"content": []}}
    assert chunks[0].extra == {"system_fingerprint": "fp"}
    assert chunks[1].usage is not None
    assert chunks[1].usage.total_tokens == 3


async def test_unknown_fields_keep_the_upstreams_order() -> None:
    # They reach the client as they came: the order of a set of their names would change from one
    # process to the next (string hashing is salted per process).
    names = [f"vendor_{n}" for n in "zqmaxbk"]
    fields = {name: n for n, name in enumerate(names)}
    raw = {"id": "x", **fields, "choices": [{"index": 0, "delta": {"content": "a", **fields}, **fields}]}
    chunks, _ = await collect_from(http_chunked(sse(raw)))
    assert list(chunks[0].extra) == names
    assert list(chunks[0].delta_extra) == names
    assert list(chunks[0].choice_extra) == names


async def test_a_vllm_deployment_is_asked_for_running_usage_which_becomes_a_token_count() -> None:
    # vLLM merges tokens into one chunk when its reader lags: the running usage on each chunk is
    # the only exact count of what was sent (a continuation's max_tokens, a failed attempt's usage).
    running = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    final = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    vllm = DEPLOYMENT.model_copy(update={"continuation": Continuation.VLLM})
    response = http_chunked(sse({**chunk("abc"), "usage": running}, final))
    chunks, upstream = await collect_from(response, {"model": "m"}, vllm)
    assert upstream.bodies[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (chunks[0].content, chunks[0].tokens, chunks[0].usage) == ("abc", 3, None)  # not usage to add up
    assert chunks[1].usage is not None
    assert chunks[1].usage.total_tokens == 8


async def test_the_body_is_read_as_the_sse_standard_says() -> None:
    """A chunk over two `data:` lines (joined with LF), CR line ends, a BOM, no space after the
    colon, an event name; a last event whose blank line never came still counts as said."""
    head, tail = orjson.dumps(chunk("a"))[:10], orjson.dumps(chunk("a"))[10:]
    body = b"\xef\xbb\xbf: hi\r\revent: delta\rdata:" + head + b"\rdata: " + tail + b"\r\rdata: [DONE]\r"
    chunks, _ = await collect_from(http_fixed("200 OK", body))
    assert [c.content for c in chunks] == ["a"]


async def test_a_line_that_never_ends_is_a_protocol_error_not_unbounded_memory() -> None:
    """A peer sends one `data:` line and keeps it going: the reader's bound ends it."""

    async def endless(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: ")
        for _ in range(20):  # 20 x 1 MiB: past the 16 MiB bound
            writer.write(b"x" * (1 << 20))
            await writer.drain()

    with pytest.raises(UpstreamProtocolError, match="more than 16777216 bytes"):
        await collect_from(endless)


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
        await asyncio.sleep(1.0)
        writer.write(b"0\r\n\r\n")

    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        started = time.monotonic()
        assert [c.content for c in await collect(b)] == ["a"]
        assert time.monotonic() - started < 0.8  # did not wait for the body's end, a second away
        await asyncio.sleep(1.1)
        await collect(b)
        await b.aclose()
    assert upstream.connections == 1


async def test_error_status_keeps_message_retry_after_and_the_connection() -> None:
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


async def test_stream_cut_is_a_protocol_error_and_is_not_retried() -> None:
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
        # Wrong shapes where objects belong: a protocol error naming the chunk, never a bug's 500.
        (sse({"choices": "x"}), UpstreamProtocolError, "malformed chunk"),
        (sse({"choices": [1]}), UpstreamProtocolError, "malformed chunk"),
        (sse({"choices": [{"index": 0, "delta": "text"}]}), UpstreamProtocolError, "malformed chunk"),
        (sse({"choices": [{"index": 0, "delta": {"content": 7}}]}), UpstreamProtocolError, "malformed chunk"),
        (sse({"choices": [{"index": 0, "delta": {"role": [1], "content": "a"}}]}), UpstreamProtocolError, "malformed"),
        (sse({"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]}), UpstreamProtocolError, "malformed chunk"),
        (sse({"choices": [], "usage": [3]}), UpstreamProtocolError, "malformed chunk"),
    ],
)
async def test_bad_streams_are_translated(body: bytes, error: type[Exception], match: str) -> None:
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


async def test_keep_alive_comments_and_crlf_lines_split_anywhere_are_understood() -> None:
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
async def test_deadlines_name_their_phase(first: bytes, phase: str) -> None:
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
    # Chunk 1 comes 0.8 s after chunk 0, which the consumer held for 0.6 s: only 0.2 s of
    # that is the upstream's, within the 0.5 s stall deadline.
    async with FakeUpstream(paced([0, 0.8])) as upstream:
        b = direct(upstream.url, first_token_s=0.5, stall_s=0.5)
        chunks = b.stream(BackendRequest(body={"model": "m", "messages": []}))
        first = await asyncio.create_task(anext(chunks))  # peeked by one task, as the HTTP layer does

        async def rest() -> list[str | None]:
            await asyncio.sleep(0.6)  # a slow client
            return [c.content async for c in chunks]

        assert [first.content, *await asyncio.create_task(rest())] == ["0", "1"]
        await b.aclose()


async def test_a_steady_stream_longer_than_the_stall_deadline_is_not_a_stall() -> None:
    async with FakeUpstream(paced([0.2] * 6)) as upstream:
        b = direct(upstream.url, first_token_s=0.5, stall_s=0.5)
        assert [c.content for c in await collect(b)] == [str(i) for i in range(6)]
        await b.aclose()


async def test_error_body_without_a_length_ends_with_the_connection() -> None:
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


async def test_connect_refused_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    b = direct(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(UpstreamConnectError):
        await collect(b)
    await b.aclose()


async def test_connect_timeout_is_a_connect_phase_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hang(*_: object, **__: object) -> None:
        await asyncio.sleep(10)

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", hang)
    b = direct("http://127.0.0.1:9/v1", connect_s=0.05)
    with pytest.raises(UpstreamTimeout) as raised:
        await collect(b)
    assert raised.value.phase == "connect"
    await b.aclose()


async def test_requests_wait_for_a_free_connection_past_max_inflight() -> None:
    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        await asyncio.sleep(0.05)
        writer.write(http_chunked(sse(chunk("a"))))

    async with FakeUpstream(respond) as upstream:
        deployment = DEPLOYMENT.model_copy(update={"api_base": upstream.url, "max_inflight": 1})
        b = OpenAICompatBackend(deployment)
        results = await asyncio.gather(*(collect(b) for _ in range(4)))
        assert [[c.content for c in r] for r in results] == [["a"]] * 4
        await b.aclose()
    # max_inflight, and one more for the health probe (the router keeps requests to max_inflight).
    assert upstream.connections == 2


def test_request_headers_cannot_smuggle_lines() -> None:
    template = RequestTemplate("POST", "/v1/chat/completions", "h", {"a": "b"})
    assert template.render(b"{}").startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: h\r\na: b\r\n")
    with pytest.raises(ValueError, match="invalid HTTP header"):
        template.render(b"{}", {"x": "1\r\nevil: 2"})


async def test_credentials_in_the_url_become_basic_auth_and_a_query_follows_every_path() -> None:
    async with FakeUpstream(answer(http_chunked(sse(chunk("a"))))) as upstream:
        url = upstream.url.replace("http://", "http://user:p%40ss@") + "?api-version=1"
        b = OpenAICompatBackend(DEPLOYMENT.model_copy(update={"api_base": url, "api_key": "sk-x"}))
        assert [c.content for c in await collect(b)] == ["a"]
        await b.aclose()
    head = upstream.heads[0].decode()
    assert head.startswith("POST /v1/chat/completions?api-version=1 HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{upstream.port}\r\n" in head  # no credentials in it
    # The URL's credentials take the place of the key, as httpx's basic auth did.
    assert f"authorization: Basic {base64.b64encode(b'user:p@ss').decode()}\r\n" in head
    assert "Bearer" not in head


async def test_the_probe_takes_the_request_pool_and_its_connection() -> None:
    async def respond(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(http_fixed("200 OK", b'{"data": []}') if n == 1 else http_chunked(sse(chunk("a"))))

    async with FakeUpstream(respond) as upstream:
        b = OpenAICompatBackend(DEPLOYMENT.model_copy(update={"api_base": upstream.url, "api_key": "sk-x"}))
        await collect(b)
        await b.probe()
        await collect(b)
        await b.aclose()
    assert upstream.connections == 1
    probe = upstream.heads[1].decode()
    assert probe.startswith("GET /v1/models HTTP/1.1\r\n")
    assert "authorization: Bearer sk-x\r\n" in probe
    assert "content-length" not in probe


@pytest.mark.parametrize("path", ["/health", "FULL"])
async def test_a_probe_at_the_root_or_a_full_url_of_the_same_origin_shares_the_pool(path: str) -> None:
    async with FakeUpstream(answer(http_fixed("200 OK", b""))) as upstream:
        health = f"http://127.0.0.1:{upstream.port}/health" if path == "FULL" else "health"
        b = OpenAICompatBackend(DEPLOYMENT.model_copy(update={"api_base": upstream.url, "health_path": health}))
        await b.probe()
        await b.probe()
        await b.aclose()
    assert upstream.heads[0].startswith(b"GET /health HTTP/1.1\r\n" if path == "FULL" else b"GET /v1/health ")
    assert upstream.connections == 1


async def test_probe_failures_are_typed() -> None:
    async with FakeUpstream(answer(http_fixed("503 Service Unavailable", b"busy"))) as upstream:
        b = direct(upstream.url)
        with pytest.raises(UpstreamStatusError) as raised:
            await b.probe()
        assert raised.value.upstream_status == 503
        await b.aclose()
    with pytest.raises(UpstreamConnectError, match="health probe failed"):
        await b.probe()  # closed pool, and the upstream is gone

    async def silent(_: asyncio.StreamWriter, __: int) -> None:
        await asyncio.sleep(10)

    async with FakeUpstream(silent) as upstream:
        b = direct(upstream.url, first_token_s=0.1)
        with pytest.raises(UpstreamTimeout, match="health probe timed out") as timed_out:
            await b.probe()
        assert timed_out.value.phase == "first_token"  # connected, then silent: slow, not unreachable
        await b.aclose()


def endless_stream() -> Respond:
    """A stream that never ends, one chunk every 10 ms: only the client can end it."""

    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        event = sse(chunk("a"), done=False)
        while not writer.is_closing():
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)

    return respond


async def until_closed(upstream: FakeUpstream) -> None:
    async with asyncio.timeout(2):
        await upstream.a_connection_closed.wait()


async def test_a_response_dropped_without_aclose_frees_its_pool_slot() -> None:
    async with FakeUpstream(endless_stream()) as upstream:
        port = upstream.port
        pool = ConnectionPool(Origin("127.0.0.1", port, None), max_connections=1, connect_timeout_s=0.5)
        request = RequestTemplate("POST", "/v1/chat/completions", f"127.0.0.1:{port}", {}).render(b"{}")

        async def wait(future: asyncio.Future[None]) -> None:
            async with asyncio.timeout(1):
                await future

        response = await pool.request(request, wait, asyncio.get_running_loop().time() + 5)
        assert await response.receive()
        del response  # never closed: the consumer went away
        await until_closed(upstream)  # the upstream stops generating
        # The one slot is free again: without that, this would wait for room and time out.
        second = await pool.request(request, wait, asyncio.get_running_loop().time() + 5)
        await second.aclose()
        await pool.aclose()


async def test_an_abandoned_stream_frees_its_connection() -> None:
    async with FakeUpstream(endless_stream()) as upstream:
        b = OpenAICompatBackend(DEPLOYMENT.model_copy(update={"api_base": upstream.url, "max_inflight": 1}))
        chunks = b.stream(BackendRequest(body={"model": "m", "messages": []}))
        assert (await anext(chunks)).content == "a"
        del chunks  # the consumer is gone without closing the generator
        gc.collect()
        await until_closed(upstream)
        second = b.stream(BackendRequest(body={"model": "m", "messages": []}))
        assert (await anext(second)).content == "a"
        await second.aclose()
        await b.aclose()


def commenting(first: bytes, every_s: float = 0.02) -> Respond:
    """`first`, then SSE comments every `every_s` forever: alive on the wire, silent in the data."""

    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(first), first))
        for _ in range(500):  # 10 s at most
            await asyncio.sleep(every_s)
            writer.write(b"%x\r\n%s\r\n" % (len(b": keep-alive\n\n"), b": keep-alive\n\n"))
            await writer.drain()

    return respond


@pytest.mark.parametrize(
    ("first", "phase"),
    [(b": waiting\n\n", "first_token"), (b"data: " + orjson.dumps(chunk("a")) + b"\n\n", "stall")],
)
async def test_comments_and_keepalives_do_not_reset_the_deadlines(first: bytes, phase: str) -> None:
    async with FakeUpstream(commenting(first)) as upstream:
        b = direct(upstream.url, first_token_s=0.3, stall_s=0.3)
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout) as raised:
            await collect(b)
        assert raised.value.phase == phase
        assert raised.value.deployment_limit  # the deployment's own limit, not a request's deadline
        assert time.monotonic() - started < 1
        await b.aclose()


def health_answer(head: bytes, body: bytes = b"", drip_s: float | None = None) -> Respond:
    """A health answer: `head`, then `body` (with `drip_s`, a byte of it at a time, that often)."""

    async def respond(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(head)
        if drip_s is None:
            writer.write(body)
            return
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(drip_s)

    return respond


JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"


def one_chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


@pytest.mark.parametrize(
    "respond",
    [
        health_answer(JSON_HEAD, one_chunk(b'{"status": "ok"')),  # JSON that does not parse
        health_answer(http_fixed("200 OK", b"x" * (2 << 20), b"content-type: text/plain\r\n")),  # beyond 1 MiB
    ],
    ids=["bad-json", "too-large"],
)
async def test_a_probe_answer_must_be_whole_bounded_and_parse_as_its_content_type(respond: Respond) -> None:
    async with FakeUpstream(respond) as upstream:
        b = direct(upstream.url)
        with pytest.raises(UpstreamProtocolError, match="health probe"):
            await b.probe()
        await b.aclose()


async def test_a_probe_reads_the_whole_answer() -> None:
    body = b'{"object": "list", "data": []}'
    async with FakeUpstream(health_answer(JSON_HEAD, one_chunk(body))) as upstream:
        b = direct(upstream.url)
        await b.probe()
        await b.probe()  # the connection was read to its end, so it serves again
        await b.aclose()
    assert upstream.connections == 1


async def test_a_probe_whose_body_drips_is_unhealthy_after_the_health_timeout() -> None:
    from gateway.routing.deployment import Deployment
    from gateway.routing.health import HealthMonitor
    from gateway.settings import HealthSettings, RoutingSettings

    drip = health_answer(JSON_HEAD, b"%x\r\n" % 400 + b'{"status": ' + b" " * 400, drip_s=0.05)
    async with FakeUpstream(drip) as upstream:
        b = direct(upstream.url)
        deployment = Deployment(b._deployment, b, RoutingSettings())
        monitor = HealthMonitor([deployment], HealthSettings(timeout_s=0.3, unhealthy_after=1))
        started = time.monotonic()
        assert await monitor.probe(deployment) is False
        assert 0.25 < time.monotonic() - started < 1
        assert not deployment.healthy
        assert not deployment.serving
        await b.aclose()
