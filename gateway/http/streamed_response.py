"""A streamed response that ends when its client goes away, without a task group per response.

Under ASGI spec 2.3 (uvicorn's) a send to a client that has left does not fail: the disconnect is
heard only on `receive`. Starlette's `StreamingResponse` therefore sends from one task of an anyio
task group and listens from another, and cancels both through anyio's cancel scopes when either
ends: two tasks, a task group and sniffio's loop lookups for every response, ~5% of a 20-chunk
stream's CPU at c=32 (py-spy). Here the request's own task sends, and one plain task listens and
cancels it when the client leaves; the sender takes that cancellation back, as `asyncio.timeout`
does its own, unless someone else (a server shutting down) cancelled it too.
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

# The spec versions under which a send to a client that left does not fail (2.4 made it fail).
_SENDS_DO_NOT_FAIL = frozenset({"2.0", "2.1", "2.2", "2.3"})


class StreamedResponse(StreamingResponse):
    """Starlette's `StreamingResponse` (the same headers, body and end), sent as described above."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("asgi", {}).get("spec_version", "2.0") not in _SENDS_DO_NOT_FAIL:
            # A server of spec 2.4 or later fails a send to a client that left: nothing to hear.
            await super().__call__(scope, receive, send)
            return
        sending = asyncio.current_task()
        assert sending is not None  # an ASGI app runs in a task
        gone = finished = False

        async def hear_disconnect() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not finished:
                gone = True
                sending.cancel()

        listener = asyncio.get_running_loop().create_task(hear_disconnect())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            # The body's generators were closed by the cancellation on its way out here.
            if not gone or sending.uncancel() > 0:
                raise
        finally:
            finished = True
            listener.cancel()
