"""The floor: the least a Python proxy on the gateway's own stack does, for bench.overhead to measure.

    python -m bench.support.floor_proxy --upstream http://127.0.0.1:PORT/v1 [--port 0]

The same uvicorn settings as `gateway serve` (uvloop, httptools, the startup heap frozen) and the
gateway's own upstream client (`gateway.backends.http_transport`), with nothing between them: no
auth, quota, audit, sessions, routing, telemetry, parsing or validation. Every request's body goes
to the upstream's /chat/completions as it came and the answer's bytes come back as they arrive
(a stream's chunks unparsed). What the gateway costs above this is what its features cost; what
this costs is the floor no feature work can go under on this interpreter, server and client.
"""

from __future__ import annotations

import argparse
import asyncio
import urllib.parse
from typing import Any

from gateway.backends.http_transport import ConnectionPool, Origin, RequestTemplate
from gateway.cli.uvicorn_runner import base_url, bind, serve

_READ_TIMEOUT_S = 30.0  # one upstream read; the fast upstream answers in microseconds
_CONNECT_TIMEOUT_S = 5.0


async def _wait(arrived: asyncio.Future[None]) -> None:
    async with asyncio.timeout(_READ_TIMEOUT_S):
        await arrived


class FloorProxy:
    """An ASGI app relaying POST bodies to one upstream endpoint over keep-alive connections."""

    def __init__(self, upstream: str) -> None:
        url = urllib.parse.urlsplit(upstream)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        self._pool = ConnectionPool(Origin(host, port, None), max_connections=512, connect_timeout_s=_CONNECT_TIMEOUT_S)
        path = url.path.rstrip("/") + "/chat/completions"
        self._chat = RequestTemplate("POST", path, f"{host}:{port}", {"content-type": "application/json"})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        loop = asyncio.get_running_loop()
        response = await self._pool.request(self._chat.render(body), _wait, loop.time() + _CONNECT_TIMEOUT_S)
        try:
            headers = [(b"content-type", (response.header("content-type") or "application/json").encode("latin-1"))]
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            while data := await response.receive():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._pool.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL, ending in /v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    sock = bind(args.host, args.port)
    url = base_url(sock)
    serve(FloorProxy(args.upstream), sock, lambda: print(f"floor proxy listening on {url}", flush=True))


if __name__ == "__main__":
    main()
