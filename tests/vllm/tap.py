"""A TCP pass-through between the gateway and one vLLM engine that fires a fault at an exact point.

vLLM produces a token every few milliseconds, faster than a client can react: a SIGKILL sent when
the client has seen N characters lands tens of tokens later, or after the answer ended. The tap
forwards the engine's bytes line by line and counts the output they carry: characters of content
(one a token for the test model) and tool-call deltas; once N are through it runs the action
(SIGKILL or SIGSTOP the engine) and forwards nothing more of that response. So the gateway has
seen the answer up to that point when the engine dies or goes silent, and the fault itself is
real. Output, not events, is counted: an engine behind on its API server (a loaded machine)
merges several tokens into one event, so an answer may have fewer events than tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import orjson


@dataclass
class Trigger:
    after_events: int  # output carried (see the module's docstring), not events
    action: Callable[[], None]
    close: bool  # True: cut the connection after the action (a kill); False: hold it open (a hang)
    fired: bool = False


class Tap:
    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._loop = asyncio.new_event_loop()
        self._trigger: Trigger | None = None
        self.port = 0
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("tap did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, after_events: int, action: Callable[[], None], close: bool = True) -> Trigger:
        """Fire `action` once, after the `after_events`-th output event of the next response."""
        self._trigger = Trigger(after_events, action, close)
        return self._trigger

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        except OSError:
            client_w.close()
            return
        upward = asyncio.ensure_future(self._pipe(client_r, up_w))
        try:
            await self._downward(up_r, client_w)
        finally:
            upward.cancel()
            for writer in (up_w, client_w):
                writer.close()
            with contextlib.suppress(BaseException):
                await upward

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    async def _downward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        events = 0
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
                carried = _output_in(line) if line.startswith(b"data: {") else 0
                if carried:
                    events += carried
                    trigger = self._trigger
                    if trigger is not None and not trigger.fired and events >= trigger.after_events:
                        trigger.fired = True
                        trigger.action()
                        if not trigger.close:
                            await reader.read()  # hold the connection open, silent, until it ends
                        return


def _output_in(line: bytes) -> int:
    """Characters of content plus tool-call deltas an SSE data line carries (0 if unparsable)."""
    try:
        event = orjson.loads(line[len(b"data: ") :])
    except orjson.JSONDecodeError:
        return 0
    carried = 0
    for choice in event.get("choices") or () if isinstance(event, dict) else ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict):
            content = delta.get("content")
            carried += len(content) if isinstance(content, str) else 0
            carried += len(delta.get("tool_calls") or ())
    return carried
