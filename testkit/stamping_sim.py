"""The sim behind a wrapper that stamps, per request, what the server saw: the independent clock
the replay accuracy tests compare against.

For each chat request it records when the whole request had been received (taken after the last
body byte reached the app, so never before the bytes arrived) and when the first response body
bytes were handed to the socket (taken just before the write, so never after it), and when the last
ones were. Both stamps are
`time.perf_counter()`, which on Linux is CLOCK_MONOTONIC and so shared with the client process.
A client's TTFT for that request can therefore never be below `first - received`, whatever the
load on the machine. `GET /_stamps` returns the stamps recorded so far and forgets them; each one
is keyed by the request's last message content, which the tests make unique.

`POST /_hold?n=N` makes the next N chat requests wait, once received, until all N have arrived
(at most HOLD_LIMIT_S), so a test can know that N streams were open at once whatever the machine's
speed; the wait is inside both the server's figure and the client's TTFT.

Run as `python -m testkit.stamping_sim [gateway sim options]`; prints the sim's ready line.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

import orjson
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sim.app import create_sim_app
from sim.server import bind_socket, load_profile, sim_url

STAMPS_PATH = "/_stamps"
HOLD_PATH = "/_hold"
HOLD_LIMIT_S = 60.0


class _Hold:
    """Releases the requests it counts once `size` of them have arrived."""

    def __init__(self, size: int) -> None:
        self.size, self.arrived = size, 0
        self.all_in = asyncio.Event()

    async def arrive(self) -> None:
        self.arrived += 1
        if self.arrived >= self.size:
            self.all_in.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HOLD_LIMIT_S):
                await self.all_in.wait()


class StampingApp:
    """ASGI wrapper around the sim; keeps the stamps of the requests it has answered."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._stamps: list[dict[str, Any]] = []
        self._hold: _Hold | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.endswith("/chat/completions"):
            if path == STAMPS_PATH:
                await self._serve_stamps(send)
                return
            if path == HOLD_PATH:
                self._hold = _Hold(int(scope["query_string"].decode().removeprefix("n=")))
                await self._serve_json(send, b"{}")
                return
            await self._app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        stamp: dict[str, Any] = {"received": time.perf_counter(), "key": _key(bytes(body))}
        hold = self._hold
        if hold is not None:
            if hold.arrived + 1 >= hold.size:
                self._hold = None  # the last one it waits for
            await hold.arrive()
        replayed = False

        async def receive_again() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        async def stamping_send(message: Message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                stamp.setdefault("first", time.perf_counter())
                stamp["last"] = time.perf_counter()
            await send(message)

        try:
            await self._app(scope, receive_again, stamping_send)
        finally:
            self._stamps.append(stamp)

    async def _serve_stamps(self, send: Send) -> None:
        payload = orjson.dumps(self._stamps)
        self._stamps = []
        await self._serve_json(send, payload)

    async def _serve_json(self, send: Send, payload: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _key(body: bytes) -> str:
    try:
        messages = orjson.loads(body)["messages"]
        return str(messages[-1]["content"])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return ""


class _Announcing(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            print(f"sim listening on {self._url}", flush=True)


def main(argv: list[str]) -> None:
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    profile = load_profile(
        None,
        ttft_ms=float(options.get("--ttft-ms", "100")),
        tpot_ms=float(options.get("--tpot-ms", "10")),
        jitter=float(options.get("--jitter", "0")),
    )
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(
        StampingApp(create_sim_app(profile)),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = _Announcing(config, sim_url(sock))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


if __name__ == "__main__":
    main(sys.argv[1:])
