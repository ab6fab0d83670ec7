"""The server's connections write once a turn of the event loop, and at once when a response ends."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.http.connection_guard import OneWritePerTurn, guarded_protocol


class Wire:
    """What reached the socket: each `write` call the transport got."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


def held(wire: Wire) -> OneWritePerTurn:
    return OneWritePerTurn(wire, asyncio.get_running_loop())  # type: ignore[arg-type]


async def test_writes_of_one_turn_leave_in_one_call_at_its_end() -> None:
    wire = Wire()
    writes = held(wire)
    writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
    writes.write(b"body")
    assert wire.writes == []
    await asyncio.sleep(0)
    assert wire.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    writes.write(b"more")
    await asyncio.sleep(0)
    assert wire.writes[1:] == [b"more"]


async def test_closing_writes_what_is_held_first() -> None:
    wire = Wire()
    writes = held(wire)
    writes.write(b"last words")
    writes.close()
    assert (wire.writes, wire.closed) == ([b"last words"], True)
    await asyncio.sleep(0)
    assert wire.writes == [b"last words"]  # nothing twice


async def test_nothing_is_written_to_a_transport_that_is_closing() -> None:
    wire = Wire()
    writes = held(wire)
    writes.write(b"too late")
    wire.closed = True
    await asyncio.sleep(0)
    assert wire.writes == []


async def test_other_transport_methods_are_the_transports_own() -> None:
    writes = held(Wire())
    assert writes.get_extra_info("peername") == ("127.0.0.1", 1)


async def test_a_served_response_and_the_next_one_on_the_connection_arrive_whole() -> None:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello " + request.query_params.get("n", ""))

    app = Starlette(routes=[Route("/", hello)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)  # a connection made before the server accepts waits in the backlog
    protocol = guarded_protocol(header_timeout_s=5, max_pending=10)
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        for n in (1, 2):
            writer.write(f"GET /?n={n} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert await asyncio.wait_for(reader.readexactly(len(b"hello 1")), 5) == f"hello {n}".encode()
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
