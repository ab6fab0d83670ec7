"""The one writer of a streamed answer's events, whether sessions are on or off.

Both streamed paths (the sessionless SSE response in `openai_api`, and the session producer that
writes to a replayable log) take their events from here, so they cannot disagree about what a
client sees: each chunk as its surface's events, the surface's closing events, and on a failure no
more chunks but the failure as a typed `GatewayError` (`stream_failure` logs a bug and makes it the
in-band internal error). Framing and the terminal event are the caller's: SSE for one,
sequence-numbered log entries for the other, and only the producer can still turn a failure before
the first event into an HTTP status.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from gateway.core.answer import Answer
from gateway.core.chunks import Chunk
from gateway.core.error_bodies import stream_failure
from gateway.core.surface import AnswerHead, AnswerWriter
from gateway.errors import GatewayError
from gateway.pipeline import RequestContext


def answer_head(ctx: RequestContext) -> AnswerHead:
    return AnswerHead(
        ctx.completion_id, ctx.created, ctx.model, ctx.include_usage, ctx.resume, ctx.echo, ctx.resumed_events
    )


class StreamEvents:
    """Render one request's chunks into event payloads (bytes) in its surface's form; after
    `payloads` ends, `failure` says whether it ended early and `answer` holds the answer so far."""

    def __init__(self, ctx: RequestContext) -> None:
        self._ctx = ctx
        self._writer: AnswerWriter = ctx.surface.writer(answer_head(ctx))
        self.answer = Answer()
        self.failure: GatewayError | None = None

    async def payloads(self, chunks: AsyncGenerator[Chunk, None]) -> AsyncGenerator[bytes, None]:
        writer = self._writer
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    self.answer.add(chunk)
                    for payload in writer.chunk(chunk):
                        yield payload
            for payload in writer.end(self._ctx.usage):
                yield payload
        except Exception as exc:  # noqa: BLE001 (a bug too gets a clean end; stream_failure logs it)
            self.failure = stream_failure(exc)
            self.failure.request_id = self._ctx.request_id

    def failure_payloads(self, failure: GatewayError | None = None) -> list[bytes]:
        """The in-band events of this stream's failure (or of `failure`, one from outside it)."""
        error = failure or self.failure
        assert error is not None
        return self._writer.fail(error)
