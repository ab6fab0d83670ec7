"""The streamed answer's two writers (sessions on: the session producer; off: the HTTP layer)
end a stream that fails after its first chunk the same way."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.sse_reader import read_events
from gateway.backends.base import BackendRequest, Chunk
from gateway.errors import InvalidRequest, UpstreamInBandError
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
    assert with_sessions == without
    content, failure, done = without
    assert content.startswith("Hello")
    assert set(failure) == {"error"}
    assert done == b"[DONE]"
    assert "a bug" not in str(failure)  # a bug's text stays in the log
