"""Delivering a planned reply over ASGI with realistic timing and the requested faults.

These are raw ASGI callables rather than Starlette responses because the faults need things a
response object cannot express: stopping mid-body, aborting the connection, or waiting for the
client to give up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sim.faults import Faults, PositionalFault
from sim.reply import Reply
from sim.state import SimState
from sim.wire import (
    DONE,
    SSE_MEDIA_TYPE,
    ChunkEncoder,
    completion_body,
    dumps,
    error_body,
    new_completion_id,
    sse_error,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_SSE_HEADERS = [
    (b"content-type", SSE_MEDIA_TYPE.encode()),
    (b"cache-control", b"no-cache"),
]
_INBAND_MESSAGE = "simulated in-band error"
_INBAND_CODE = "sim_inband_error"


class SimulatedCut(Exception):
    """Raised mid-response so the ASGI server drops the connection without finishing the body."""


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class StallResponse:
    """Sends nothing at all until the client goes away, like a wedged backend."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await wait_for_disconnect(receive)


_KEEPALIVE = b": keep-alive\n\n"
_KEEPALIVE_EVERY_S = 0.1


async def _send_keepalives(send: Send, watcher: asyncio.Future[None], first: bytes = b"") -> None:
    """SSE comments every 0.1 s until the client goes away: a server that looks alive and says nothing."""
    body = first + _KEEPALIVE
    while not watcher.done():
        await send({"type": "http.response.body", "body": body, "more_body": True})
        body = _KEEPALIVE
        await asyncio.wait({watcher}, timeout=_KEEPALIVE_EVERY_S)


class DripResponse:
    """A 200 JSON answer whose body starts and never ends: one byte every 0.1 s until the client
    goes away (a health endpoint that is wedged after its headers)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            body = b'{"status": '
            while not watcher.done():
                await send({"type": "http.response.body", "body": body, "more_body": True})
                body = b" "
                await asyncio.wait({watcher}, timeout=_KEEPALIVE_EVERY_S)
        finally:
            watcher.cancel()


class _Pacer:
    """Releases emissions on schedule: TTFT for the first, then TPOT each, against absolute
    deadlines so event-loop overhead does not stretch long streams."""

    __slots__ = ("_due", "_loop", "_slow", "_state")

    def __init__(self, state: SimState, slow: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._state = state
        self._slow = slow
        self._due = self._loop.time() + state.first_token_delay(slow)

    async def next(self) -> None:
        delay = self._due - self._loop.time()
        # Even when behind schedule, yield so one fast stream cannot starve the others.
        await asyncio.sleep(delay if delay > 0 else 0)
        self._due += self._state.token_delay(self._slow)

    def total(self, steps: int) -> float:
        """Seconds until `steps` emissions would be done, for replies sent in one piece."""
        return max(0.0, self._due - self._loop.time()) + sum(self._state.token_delay(self._slow) for _ in range(steps))


class ChatResponse:
    """Serves one chat completion, streamed or not, applying `faults` along the way."""

    def __init__(self, state: SimState, reply: Reply, faults: Faults) -> None:
        self._state = state
        self._reply = reply
        self._faults = faults
        positional = faults.first_positional()
        # A fault past the end of the reply never fires.
        self._trip = positional if positional is not None and positional[0] <= reply.steps else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._state.counters.in_flight += 1
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            if self._reply.stream:
                finished = await self._stream(send, watcher)
            else:
                finished = await self._complete(send, watcher)
        finally:
            watcher.cancel()
            # Looked up again: a reset during the response swaps the counters object.
            self._state.counters.in_flight -= 1
        if finished:
            self._state.counters.completed += 1
        else:
            self._state.counters.client_disconnects += 1

    def _fault_at(self, index: int) -> PositionalFault | None:
        fault = self._trip[1] if self._trip is not None and self._trip[0] == index else None
        if fault is not None:
            self._state.record_fault(fault.value)
        return fault

    def _steps(self, encoder: ChunkEncoder) -> list[bytes]:
        call = self._reply.tool_call
        if call is None:
            tokens, size = self._reply.tokens, self._faults.chunk_tokens
            return [encoder.content("".join(tokens[i : i + size])) for i in range(0, len(tokens), size)]
        return [encoder.tool_header(call), *(encoder.tool_arguments(f) for f in call.fragments())]

    async def _stream(self, send: Send, watcher: asyncio.Future[None]) -> bool:
        """Stream the reply; False when the client went away first."""
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        reply = self._reply
        encoder = ChunkEncoder(new_completion_id(), reply.model)
        steps = self._steps(encoder)
        pending = encoder.role(None if reply.tool_call else "")
        pacer = _Pacer(self._state, self._faults.slow)
        for index in range(len(steps) + 1):
            last = index == len(steps)
            if not last:
                await pacer.next()
            if watcher.done():
                return False
            fault = self._fault_at(index)
            if fault is PositionalFault.MALFORMED:
                pending += encoder.malformed()
            elif fault is not None:
                return await self._stream_fault(send, watcher, pending, fault)
            if last:
                break
            await send({"type": "http.response.body", "body": pending + steps[index], "more_body": True})
            pending = b""
        tail = pending + encoder.finish(reply.finish_reason)
        if reply.include_usage:
            tail += encoder.usage(reply)
        await send({"type": "http.response.body", "body": tail + DONE, "more_body": False})
        return True

    async def _stream_fault(
        self, send: Send, watcher: asyncio.Future[None], pending: bytes, fault: PositionalFault
    ) -> bool:
        if fault is PositionalFault.ABORT:
            if pending:
                await send({"type": "http.response.body", "body": pending, "more_body": True})
            raise SimulatedCut("simulated connection cut")
        if fault is PositionalFault.STALL:
            await watcher
            return False
        if fault is PositionalFault.KEEPALIVE:
            await _send_keepalives(send, watcher, pending)
            return False
        body = pending + sse_error(_INBAND_MESSAGE, _INBAND_CODE) + DONE
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return True

    async def _complete(self, send: Send, watcher: asyncio.Future[None]) -> bool:
        """Send the whole completion after the time generation would take; False on disconnect."""
        reply = self._reply
        steps = reply.steps if self._trip is None else self._trip[0]
        pacer = _Pacer(self._state, self._faults.slow)
        await asyncio.sleep(pacer.total(steps))
        if watcher.done():
            return False
        body = dumps(completion_body(reply, new_completion_id(), int(time.time())))
        fault = self._fault_at(steps)
        if fault in (PositionalFault.STALL, PositionalFault.KEEPALIVE):  # no comments outside a stream
            await watcher
            return False
        if fault is PositionalFault.ABORT:
            # Promise the full body, deliver half: the client sees the connection die mid-response.
            await _start_json(send, len(body))
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            raise SimulatedCut("simulated connection cut")
        if fault is PositionalFault.INBAND_ERROR:
            body = error_body(_INBAND_MESSAGE, 500, code=_INBAND_CODE)
        elif fault is PositionalFault.MALFORMED:
            body = body[: len(body) // 2]
        await _start_json(send, len(body))
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return True


async def _start_json(send: Send, length: int) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(length).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
