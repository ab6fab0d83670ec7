"""StreamedResponse: the body goes out in the request's task; a client that leaves ends it there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from gateway.http.streamed_response import StreamedResponse

SCOPE: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


class Client:
    """The server side of one connection, as uvicorn shows it to an app under ASGI spec 2.3:
    sends never fail, and `receive` answers only when the client disconnects."""

    def __init__(self) -> None:
        self.sent: list[MutableMapping[str, Any]] = []
        self.left = asyncio.Event()
        self.got_body = asyncio.Event()

    async def receive(self) -> MutableMapping[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)
        if message.get("body"):
            self.got_body.set()

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


class Frames:
    """A body that sends one frame, then waits for more until it is closed."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            await asyncio.Event().wait()  # the stream's next event never comes
            yield b"data: 2\n\n"
        finally:
            self.closed.set()


async def test_a_finished_body_ends_the_response_and_leaves_no_cancellation_behind() -> None:
    async def two() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    client = Client()
    await StreamedResponse(two(), media_type="text/event-stream")(SCOPE, client.receive, client.send)
    assert client.sent[0]["type"] == "http.response.start"
    assert (b"content-type", b"text/event-stream; charset=utf-8") in client.sent[0]["headers"]
    assert client.bodies == [b"a", b"b", b""]
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0
    await asyncio.sleep(0)  # the listener, cancelled, must not cancel this task afterwards
    assert current.cancelling() == 0


async def test_a_client_that_leaves_closes_the_body_and_the_response_returns() -> None:
    client, frames = Client(), Frames()
    sending = asyncio.create_task(StreamedResponse(frames())(SCOPE, client.receive, client.send))
    await client.got_body.wait()
    client.left.set()
    await sending  # returns normally: the cancellation was the response's own
    assert frames.closed.is_set()
    assert client.bodies == [b"data: 1\n\n"]
    assert sending.cancelling() == 0


async def test_a_cancellation_from_outside_still_cancels_the_sender() -> None:
    client, frames = Client(), Frames()
    sending = asyncio.create_task(StreamedResponse(frames())(SCOPE, client.receive, client.send))
    await client.got_body.wait()
    sending.cancel()  # a server shutting down
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert frames.closed.is_set()


async def test_a_shutdown_that_coincides_with_the_client_leaving_is_not_swallowed() -> None:
    client, frames = Client(), Frames()
    sending = asyncio.create_task(StreamedResponse(frames())(SCOPE, client.receive, client.send))
    await client.got_body.wait()
    client.left.set()
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert frames.closed.is_set()


async def test_under_spec_2_4_a_failing_send_is_the_disconnect_as_in_starlette() -> None:
    client = Client()

    async def failing_send(message: MutableMapping[str, Any]) -> None:
        if message.get("body"):
            raise OSError("the client left")
        await client.send(message)

    scope = {**SCOPE, "asgi": {"version": "3.0", "spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):
        await StreamedResponse(Frames()())(scope, client.receive, failing_send)
