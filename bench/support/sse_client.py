"""One streamed chat completion, read as it arrives: every content token with its arrival time.

The failover benchmark needs more than the load generator records: the text itself (to compare
with the uninterrupted answer), in-band error events, and a hook that runs the moment the k-th
content token arrives (to SIGKILL the backend at a known point of the answer). Requests run one
at a time, so httpx's per-chunk cost (tens of microseconds) is far below what is measured here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from common.sse_reader import SseReader

_DONE = b"[DONE]"


@dataclass
class StreamRecord:
    """What the client saw of one stream; times are `time.perf_counter()` seconds."""

    request_id: str
    started: float
    status: int = 0
    token_times: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # in-band error events and client-side failures
    finish_reason: str | None = None
    done: bool = False  # saw data: [DONE]
    hook_time: float | None = None  # when the on-token hook ran
    ended: float = 0.0  # the response ended (or failed)

    @property
    def text(self) -> str:
        return "".join(self.tokens)


@dataclass(frozen=True)
class Hook:
    """Run `action` right after the `at_token`-th content token (1-based) arrives."""

    at_token: int
    action: Callable[[], None]


class _Events:
    """Splits a byte stream into SSE events and applies each to the record."""

    def __init__(self, record: StreamRecord, hook: Hook | None) -> None:
        self._record = record
        self._hook = hook
        self._reader = SseReader()

    def feed(self, data: bytes, now: float) -> None:
        for payload, _, _ in self._reader.feed(data):
            self._data(payload, now)

    def _data(self, payload: bytes, now: float) -> None:
        record = self._record
        if payload == _DONE:
            record.done = True
            return
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            record.errors.append(f"unparsable event: {payload[:80]!r}")
            return
        if "error" in chunk:
            record.errors.append(f"in-band error: {str(chunk['error'])[:160]}")
            return
        self._choice(chunk.get("choices") or [], now)

    def _choice(self, choices: list[dict[str, Any]], now: float) -> None:
        if not choices:
            return  # the usage chunk
        choice, record = choices[0], self._record
        content = (choice.get("delta") or {}).get("content")
        if content:
            record.tokens.append(content)
            record.token_times.append(now)
            self._maybe_hook(now)
        record.finish_reason = choice.get("finish_reason") or record.finish_reason

    def _maybe_hook(self, now: float) -> None:
        if self._hook is not None and len(self._record.tokens) == self._hook.at_token:
            self._record.hook_time = time.perf_counter()
            self._hook.action()


async def stream_chat(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    request_id: str,
    hook: Hook | None = None,
    timeout_s: float = 15.0,
) -> StreamRecord:
    """POST a streaming chat completion and record it; never raises for network failures."""
    record = StreamRecord(request_id, time.perf_counter())
    events = _Events(record, hook)
    headers = {"X-Request-Id": request_id}
    try:
        async with (
            asyncio.timeout(timeout_s),
            client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            record.status = r.status_code
            async for data in r.aiter_raw():
                events.feed(data, time.perf_counter())
    except (httpx.HTTPError, TimeoutError) as exc:
        record.errors.append(f"client: {type(exc).__name__}: {str(exc)[:120]}")
    record.ended = time.perf_counter()
    return record
