"""The streamed answer's two writers (sessions on: the session producer; off: the HTTP layer)
end a stream that fails after its first chunk the same way."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.datastructures import Headers

from common.sse_reader import read_events
from gateway.backends.base import BackendRequest
from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.core.chunks import Chunk
from gateway.errors import InvalidRequest, UpstreamInBandError
from gateway.http.openai_api import header_map
from tests.backends.upstream import DEPLOYMENT, FakeUpstream, answer, chunk, http_chunked, sse
from tests.telemetry_app import traced_gateway


class FailingAfterOutput:
    """Says one word, then fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.name = "a"
        self._error = error

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        yield Chunk(role="assistant", content="")
        yield Chunk(content="Hello")
        raise self._error

    async def probe(self) -> None:
        return None

    def cut_idle(self, idle_s: float) -> int:
        return 0

    async def aclose(self) -> None:
        return None


async def stream_end(tmp_path: Path, error: Exception, sessions: bool) -> tuple[Any, ...]:
    """The content streamed, then what the stream ended with (the last two events' data)."""
    backend = FailingAfterOutput(error)
    async with traced_gateway(tmp_path, backend, tracing=False, sessions={"enabled": sessions}) as gateway:
        reply = await gateway.chat(stream=True)
    assert reply.status_code == 200, reply.text
    events = [data for data, _, _ in read_events(reply.content)]
    content = "".join(
        choice["delta"].get("content") or "" for data in events[:-2] for choice in orjson.loads(data).get("choices", [])
    )
    return content, orjson.loads(events[-2]), events[-1]


@pytest.mark.parametrize(
    "error",
    [
        UpstreamInBandError("the model server fell over", deployment="a"),
        InvalidRequest("a tool call the policy refuses", param="tools"),
        RuntimeError("a bug in the gateway"),
    ],
    ids=["upstream-error", "error-naming-a-param", "unexpected"],
)
async def test_both_writers_end_a_failed_stream_with_the_same_in_band_error(tmp_path: Path, error: Exception) -> None:
    with_sessions = await stream_end(tmp_path / "on", error, sessions=True)
    without = await stream_end(tmp_path / "off", error, sessions=False)
    assert _without_request_id(with_sessions) == _without_request_id(without)  # each names its own request
    content, failure, done = without
    assert content.startswith("Hello")
    assert set(failure) == {"error"}
    assert done == b"[DONE]"
    assert "a bug" not in str(failure)  # a bug's text stays in the log


def _without_request_id(end: tuple[Any, ...]) -> tuple[Any, ...]:
    content, failure, done = end
    # A server-side error names its request (whose log has the detail): each writer its own.
    message = re.sub(r" \(request [0-9a-f]{32}\)$", "", failure["error"]["message"])
    return content, {"error": {**failure["error"], "message": message}}, done


@pytest.mark.parametrize("sessions", [True, False], ids=["sessions", "no-sessions"])
async def test_chunks_that_arrive_in_one_read_reach_the_client_one_event_each(tmp_path: Path, sessions: bool) -> None:
    role = {"id": "u", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    finish = {"id": "u", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    words = ["Once", " upon", " a", " time"]
    body = sse(role, *(chunk(word) for word in words), finish)  # one write: the backend reads it at once
    async with FakeUpstream(answer(http_chunked(body))) as upstream:
        backend = OpenAICompatBackend(DEPLOYMENT.model_copy(update={"name": "a", "api_base": upstream.url}))
        async with traced_gateway(tmp_path, backend, tracing=False, sessions={"enabled": sessions}) as gateway:
            reply = await gateway.chat(stream=True)
    assert reply.status_code == 200, reply.text
    events = [orjson.loads(data) for data, _, _ in read_events(reply.content) if data != b"[DONE]"]
    deltas = [event["choices"][0]["delta"] for event in events]
    assert deltas == [{"role": "assistant", "content": ""}, *({"content": word} for word in words), {}]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert {event["id"] for event in events} == {events[0]["id"]} != {"u"}


def test_the_header_map_answers_as_starlettes_headers_do() -> None:
    raw = [
        (b"x-session-id", b"first"),
        (b"authorization", b"Bearer k"),
        (b"x-session-id", b"second"),
        (b"x-note", b"\xe9"),
    ]
    scope = {"type": "http", "headers": raw}
    starlette = Headers(scope=scope)
    mapped = header_map(scope)
    for name in ("x-session-id", "authorization", "x-note", "x-absent"):
        assert mapped.get(name) == starlette.get(name)
    assert ("x-session-id" in mapped, "x-absent" in mapped) == (True, False)
