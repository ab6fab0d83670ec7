"""Each way a request can go wrong lands under its own failure reason (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import orjson
import pytest

from replay.client import ClientConfig, make_http_client, send_one
from replay.record import RequestRecord
from replay.samples import Prepared

DONE = b"data: [DONE]\n\n"
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
SSE = {"content-type": "text/event-stream"}
Item = bytes | float | Exception


def data(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def token(text: str) -> bytes:
    return data({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def finish(reason: str) -> bytes:
    return data({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})


def usage(tokens: int) -> bytes:
    return data({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}})


def tool_delta(arguments: str) -> bytes:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return data({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})


async def _body(items: Sequence[Item]) -> AsyncIterator[bytes]:
    for item in items:
        if isinstance(item, float):
            await asyncio.sleep(item)
        elif isinstance(item, Exception):
            raise item
        else:
            yield item


def _config(**overrides: Any) -> ClientConfig:
    fields: dict[str, Any] = {"first_token_timeout_s": 2.0, "stall_timeout_s": 2.0, "request_timeout_s": 5.0}
    return ClientConfig("http://127.0.0.1:9/v1", **{**fields, **overrides})


async def classify(
    items: Sequence[Item],
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
    stream: bool = True,
    expect_length: bool = False,
    **config: Any,
) -> RequestRecord:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=SSE if headers is None else headers, content=_body(items))

    settings = _config(**config)
    prepared = Prepared("s0", b"{}", stream, expect_length)
    async with make_http_client(settings, 1, httpx.MockTransport(handler)) as http:
        return await send_one(http, settings, prepared, 0, time.perf_counter())


async def test_a_clean_stream_succeeds_with_usage_tokens() -> None:
    record = await classify([ROLE, token("Hel"), token("lo"), token("!"), finish("stop"), usage(3), DONE])
    assert (record.ok, record.reason, record.status, record.finish_reason) == (True, None, 200, "stop")
    assert (record.output_tokens, record.tokens_source) == (3, "usage")
    assert len(record.output_times_s) == 3
    assert len(record.event_times_s) == 7
    assert record.ttft_s == record.output_times_s[0]
    assert record.e2e_s is not None
    assert record.e2e_s >= record.ttft_s


async def test_without_usage_the_output_chunks_are_counted() -> None:
    record = await classify([ROLE, token("a"), token("b"), finish("stop"), DONE])
    assert (record.ok, record.output_tokens, record.tokens_source) == (True, 2, "chunks")


@pytest.mark.parametrize(("status", "reason"), [(429, "http_429"), (404, "http_404"), (503, "http_503")])
async def test_http_errors_are_grouped_by_status(status: int, reason: str) -> None:
    body = orjson.dumps({"error": {"message": "nope"}})
    headers = {"content-type": "application/json", "retry-after": "1"}
    record = await classify([body], status=status, headers=headers)
    assert (record.ok, record.reason, record.status) == (False, reason, status)
    assert "nope" in record.detail
    assert "retry-after 1" in record.detail


async def test_a_stream_that_ends_without_done_is_cut() -> None:
    record = await classify([ROLE, token("a"), token("b")])
    assert record.reason == "stream_cut"


async def test_a_connection_dropped_mid_stream_is_cut() -> None:
    record = await classify([ROLE, token("a"), httpx.RemoteProtocolError("peer closed connection")])
    assert record.reason == "stream_cut"
    assert "RemoteProtocolError" in record.detail


async def test_an_unparsable_chunk_is_malformed_even_if_the_stream_recovers() -> None:
    record = await classify([ROLE, token("a"), b'data: {"choices":[{"delta":{"content":"\n\n', token("b"), DONE])
    assert record.reason == "malformed_chunk"


async def test_an_error_event_inside_the_stream_is_an_in_band_error() -> None:
    record = await classify([ROLE, token("a"), data({"error": {"message": "boom", "code": "x"}}), DONE])
    assert record.reason == "inband_error"
    assert "boom" in record.detail


async def test_content_filter_finish_is_its_own_failure() -> None:
    record = await classify([ROLE, token("a"), finish("content_filter"), DONE])
    assert (record.ok, record.reason) == (False, "content_filter")


async def test_unexpected_length_finish_is_reported_and_its_failure_is_configurable() -> None:
    items = [ROLE, token("a"), finish("length"), DONE]
    strict = await classify(items)
    assert (strict.ok, strict.reason) == (False, "length")
    tolerant = await classify(items, length_is_failure=False)
    assert (tolerant.ok, tolerant.reason) == (True, "length")
    expected = await classify(items, expect_length=True)
    assert (expected.ok, expected.reason) == (True, None)


async def test_a_reply_without_content_or_tool_call_is_empty() -> None:
    record = await classify([ROLE, finish("stop"), usage(0), DONE])
    assert record.reason == "empty_output"


async def test_tool_call_arguments_must_assemble_into_a_json_object() -> None:
    good = await classify([ROLE, tool_delta('{"city": '), tool_delta('"Paris"}'), finish("tool_calls"), DONE])
    assert (good.ok, good.finish_reason) == (True, "tool_calls")
    bad = await classify([ROLE, tool_delta('{"city": "Par'), finish("tool_calls"), DONE])
    assert bad.reason == "invalid_tool_args"


async def test_no_first_token_within_the_limit_is_a_first_token_timeout() -> None:
    record = await classify([ROLE, 5.0, token("late"), DONE], first_token_timeout_s=0.2)
    assert record.reason == "first_token_timeout"
    assert record.output_times_s == []
    assert len(record.event_times_s) == 1


async def test_silence_after_the_first_token_is_a_stall_timeout() -> None:
    record = await classify([ROLE, token("a"), 0.05, token("b"), 5.0, DONE], stall_timeout_s=0.3)
    assert record.reason == "stall_timeout"
    assert len(record.output_times_s) == 2


async def test_a_trickling_stream_still_ends_at_the_request_timeout() -> None:
    trickle: list[Item] = [ROLE]
    for _ in range(40):
        trickle += [token("x"), 0.05]
    record = await classify(trickle, stall_timeout_s=1.0, request_timeout_s=0.4)
    assert record.reason == "request_timeout"


async def test_a_connect_timeout_is_classified() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    config = _config()
    async with make_http_client(config, 1, httpx.MockTransport(handler)) as http:
        record = await send_one(http, config, Prepared("s0", b"{}", True, False), 0, time.perf_counter())
    assert record.reason == "connect_timeout"
    assert record.status is None


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = ClientConfig(f"http://127.0.0.1:{port}/v1", connect_timeout_s=2.0)
    async with make_http_client(config) as http:
        record = await send_one(http, config, Prepared("s0", b"{}", True, False), 0, time.perf_counter())
    assert (record.ok, record.reason) == (False, "connect_error")


def _completion(**message: Any) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
    return orjson.dumps({"choices": [choice], "usage": {"completion_tokens": 7}})


async def test_a_non_streamed_body_is_classified_like_a_stream() -> None:
    json_headers = {"content-type": "application/json"}
    ok = await classify([_completion(content="Hello there")], stream=False, headers=json_headers)
    assert (ok.ok, ok.output_tokens, ok.tokens_source) == (True, 7, "usage")
    assert ok.ttft_s == ok.e2e_s
    assert ok.tpot_s is None
    broken = await classify([b'{"choices": ['], stream=False, headers=json_headers)
    assert broken.reason == "malformed_chunk"
    error = await classify([orjson.dumps({"error": {"message": "x"}})], stream=False, headers=json_headers)
    assert error.reason == "inband_error"
    empty = await classify([_completion(content="")], stream=False, headers=json_headers)
    assert empty.reason == "empty_output"


async def test_a_json_answer_to_a_stream_request_is_read_as_a_body() -> None:
    record = await classify([_completion(content="Hi")], headers={"content-type": "application/json"})
    assert record.ok
    assert record.output_tokens == 7


async def test_a_body_held_open_after_done_still_counts_as_a_complete_answer() -> None:
    record = await classify([ROLE, token("a"), finish("stop"), DONE, 5.0], stall_timeout_s=3.0)
    assert (record.ok, record.reason) == (True, None)
    assert record.e2e_s is not None
    assert record.e2e_s < 0.5, "E2E ends at [DONE], not when the connection is given up"


async def test_an_error_status_whose_body_hangs_is_still_reported_by_status() -> None:
    json_headers = {"content-type": "application/json"}
    record = await classify([b'{"error": ', 5.0], status=503, headers=json_headers, first_token_timeout_s=0.2)
    assert (record.reason, record.status) == ("http_503", 503)
