"""The OpenAI-compatible backend over httpx's MockTransport: wire handling and error translation."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson
import pytest

from gateway.backends.base import BackendRequest, Chunk
from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.errors import (
    UpstreamConnectError,
    UpstreamInBandError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import DeploymentSettings

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


async def test_no_first_token_within_the_deadline_is_a_first_token_timeout() -> None:
    async def never() -> object:
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
