"""The one writer of a streamed answer's events, whether sessions are on or off.

Both streamed paths (the sessionless SSE response in `openai_api`, and the session producer that
writes to a replayable log) take their events from here, so they cannot disagree about what a
client sees: each chunk as a chat.completion.chunk, the usage chunk when the client asked for it,
and on a failure no more chunks but the failure as a typed `GatewayError` (`stream_failure` logs
a bug and makes it the in-band internal error). Framing and [DONE] are the caller's: SSE for one,
sequence-numbered log entries for the other, and only the producer can still turn a failure before
the first event into an HTTP status.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from gateway.core.chunks import Chunk
from gateway.core.error_bodies import gateway_error_body, stream_failure
from gateway.errors import GatewayError
from gateway.pipeline import RequestContext
from gateway.wire import ChunkRenderer, Completion, dumps


class StreamEvents:
    """Render one request's chunks into event payloads (JSON bytes); after `payloads` ends,
    `failure` says whether it ended early and `answer` holds the assistant message so far."""

    def __init__(self, ctx: RequestContext) -> None:
        self._ctx = ctx
        self._renderer = ChunkRenderer(ctx.completion_id, ctx.created, ctx.model)
        self.answer = Completion()
        self.failure: GatewayError | None = None

    async def payloads(self, chunks: AsyncGenerator[Chunk, None]) -> AsyncGenerator[bytes, None]:
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    self.answer.add(chunk)
                    for rendered in self._renderer.render_all(chunk):
                        yield dumps(rendered)
            if self._ctx.include_usage:
                yield dumps(self._renderer.render_usage(self._ctx.usage))
        except Exception as exc:  # noqa: BLE001 (a bug too gets a clean end; stream_failure logs it)
            self.failure = stream_failure(exc)
            self.failure.request_id = self._ctx.request_id

    def failure_payload(self) -> bytes:
        assert self.failure is not None
        return dumps(gateway_error_body(self.failure))
