"""Sending one request and turning what came back into a classified `RequestRecord`.

Timing: `time.perf_counter()` is read just before the first byte of the request is handed to the
transport (httpx's trace hook at the start of the header write, after any connect: the clock of
TTFT and E2E), when the body has been written (the gap is this request's write delay), on every
network read, and when `[DONE]` arrives. The start stamp is taken before the write rather than after
it because the write yields to the event loop: a stamp after it can land after the server already
had the request, which cut loop time out of TTFT and made it read low. Taken before, whatever the
loop does can only make a figure read high, and the per-request client delay says by how much.

Client-side timeouts are one asyncio deadline that moves with the phase of the exchange: until the
first output chunk it is the first-token deadline, after it every read pushes it to now + stall
timeout, and nothing passes the overall request deadline. So the phase at expiry names the
timeout, and every request is bounded.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import ssl
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from common.sse_reader import SseReader, SseTooLarge
from replay import record as r
from replay.record import RequestRecord
from replay.samples import CHAT, MESSAGES, RESPONSES, Prepared
from replay.stream import StreamState, estimate_tokens, first_invalid_arguments, message_output, response_output
from replay.wire import coalescing_transport

# httpx imports httpcore when the first client is built (~60 ms) and httpcore imports these on the
# first connection (~20 ms); inside the measured run that stalls the event loop and shows up as lag.
_LAZY_STACK_MODULES = ("anyio._backends._asyncio", "h11", "h2.connection")

_TEXT_KEYS = ("content", "reasoning_content", "reasoning")
_PATHS = {CHAT: "/chat/completions", RESPONSES: "/responses", MESSAGES: "/messages"}
_ERROR_BODY_BYTES = 4096
# After [DONE] the body should end at once; a server that holds it open gets this long before the
# connection is dropped, and the answer still counts (it was complete).
_AFTER_DONE_S = 1.0
_DETAIL_CHARS = 200


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Where to send and the client-side limits; `base_url` is the endpoint root (…/v1)."""

    base_url: str
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 60.0
    stall_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    length_is_failure: bool = True

    def url(self, api: str = CHAT) -> str:
        """Where a request for `api` (a sample's: chat completions, the Responses or the Messages
        API) goes."""
        return self.base_url.rstrip("/") + _PATHS.get(api, "/chat/completions")


async def warm_up_stack() -> None:
    """Import what the HTTP stack would otherwise import lazily mid-run; missing extras are fine."""
    async with httpx.AsyncClient():
        pass
    for name in _LAZY_STACK_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def make_http_client(
    config: ClientConfig,
    connections: int = 1,
    transport: httpx.AsyncBaseTransport | None = None,
    tls: ssl.SSLContext | None = None,
) -> httpx.AsyncClient:
    headers = {"content-type": "application/json", **dict(config.headers)}
    if config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    # Reads are bounded by the phase deadline in `send_one`, not by httpx's per-read timeout.
    timeout = httpx.Timeout(
        connect=config.connect_timeout_s, read=None, write=config.connect_timeout_s, pool=config.connect_timeout_s
    )
    if transport is None:
        transport = coalescing_transport(tls if tls is not None else ssl.create_default_context(), connections)
    return httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers, transport=transport)


class ClientPool:
    """`size` single-connection clients, one checked out per request in flight.

    One client with a `size`-connection pool would be simpler, but httpcore 1.0 scans every pooled
    connection (with a poll() on each idle socket) on every request event (encode/httpcore#1035):
    at 200 connections that bookkeeping took more CPU than the streams and delayed the timestamps
    by hundreds of milliseconds. With one connection per client it stays O(1). Clients are made on
    first need and share one TLS context, since building a context per client costs milliseconds.
    """

    def __init__(self, config: ClientConfig, size: int, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._config, self._size, self._transport = config, max(1, size), transport
        # LIFO reuse keeps the warm, already connected clients busy first. Each free client carries
        # when it was released, so a request knows since when one has been available to it.
        self._free: list[tuple[httpx.AsyncClient, float]] = []
        self._waiting: collections.deque[asyncio.Future[tuple[httpx.AsyncClient, float]]] = collections.deque()
        self._made: list[httpx.AsyncClient] = []
        # httpx builds a TLS context for every client, even for plain http; one shared is enough.
        self._tls = ssl.create_default_context()

    async def acquire(self) -> tuple[httpx.AsyncClient, float | None]:
        """A client for one request, and since when a client has been available (None: at once,
        a new one); waits while `size` requests are in flight."""
        if not self._free and len(self._made) < self._size:
            self._made.append(make_http_client(self._config, 1, self._transport, self._tls))
            return self._made[-1], None
        if self._free:
            # With room for another client, one was available all along; else since the oldest release.
            since = None if len(self._made) < self._size else min(freed for _, freed in self._free)
            return self._free.pop()[0], since
        waiter: asyncio.Future[tuple[httpx.AsyncClient, float]] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        client, freed = await waiter
        return client, freed

    def release(self, client: httpx.AsyncClient) -> None:
        freed = time.perf_counter()
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():  # a waiter whose acquire was cancelled is skipped
                waiter.set_result((client, freed))
                return
        self._free.append((client, freed))

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self._made), return_exceptions=True)
        self._made.clear()


async def send_one(
    http: httpx.AsyncClient, config: ClientConfig, prepared: Prepared, index: int, origin: float
) -> RequestRecord:
    """Send `prepared` and classify the outcome; never raises for network or protocol problems."""
    exchange = _Exchange(config, prepared, index, origin)
    try:
        async with exchange.guard:
            await exchange.run(http)
    except TimeoutError:
        if not exchange.guard.expired():
            raise
        exchange.timed_out()
    except httpx.HTTPError as exc:
        exchange.transport_failed(exc)
    return exchange.finish()


class _Exchange:
    """One request in flight: its clock, its moving deadline and what has arrived so far."""

    def __init__(self, config: ClientConfig, prepared: Prepared, index: int, origin: float) -> None:
        self._config = config
        self._prepared = prepared
        self._loop = asyncio.get_running_loop()
        self.dispatched = time.perf_counter()
        self._sent: float | None = None
        self._written: float | None = None
        self._ended: float | None = None
        self._headers: float | None = None
        self.record = RequestRecord(index, prepared.sample_id, prepared.stream, self.dispatched - origin)
        self.state = StreamState()
        self._text_tokens: int | None = None
        self._overall = self._loop.time() + config.request_timeout_s
        first = config.first_token_timeout_s if prepared.stream else config.request_timeout_s
        self.guard = asyncio.timeout_at(min(self._loop.time() + first, self._overall))

    async def _trace(self, name: str, info: dict[str, Any]) -> None:
        if name.endswith("send_request_headers.started"):
            self._sent = time.perf_counter()
        elif name.endswith("send_request_body.complete"):
            self._written = time.perf_counter()

    async def run(self, http: httpx.AsyncClient) -> None:
        request = http.build_request(
            "POST", self._config.url(self._prepared.api), content=self._prepared.body, extensions={"trace": self._trace}
        )
        response = await http.send(request, stream=True)
        self._headers = time.perf_counter()
        try:
            self.record.status = response.status_code
            if not 200 <= response.status_code < 300:
                await self._http_error(response)
            elif self._prepared.stream and response.headers.get("content-type", "").startswith("text/event-stream"):
                await self._read_stream(response)
            else:
                # Also taken when a stream was asked for but the server answered with one JSON body.
                await self._read_body(response)
        finally:
            await response.aclose()

    async def _http_error(self, response: httpx.Response) -> None:
        body = b""
        async for data in response.aiter_bytes():
            body += data
            if len(body) >= _ERROR_BODY_BYTES:
                break
        self._ended = time.perf_counter()
        detail = f"HTTP {response.status_code}: {body[:_DETAIL_CHARS].decode(errors='replace')}"
        retry_after = response.headers.get("retry-after")
        if retry_after is not None:
            detail += f" (retry-after {retry_after})"
        self.state.fail(r.http_reason(response.status_code), detail)

    async def _read_stream(self, response: httpx.Response) -> None:
        reader, state = SseReader(), self.state
        async for data in response.aiter_bytes():
            now = time.perf_counter()
            try:
                events = reader.feed(data)
            except SseTooLarge as exc:
                self._ended = now
                state.fail(r.MALFORMED_CHUNK, f"the stream sent {exc}")
                return
            for payload, name, _ in events:
                state.on_event(name, payload, now)
                if state.done and self._ended is None:
                    self._ended = now
                    self.guard.reschedule(min(self._loop.time() + _AFTER_DONE_S, self._overall))
            if state.output_times and not state.done:
                self.guard.reschedule(min(self._loop.time() + self._config.stall_timeout_s, self._overall))
        now = time.perf_counter()
        for payload, name, _ in reader.close():
            state.on_event(name, payload, now)
        if self._ended is None:
            self._ended = now
        if not state.done:
            state.fail(r.STREAM_CUT, "the stream ended without data: [DONE]")

    async def _read_body(self, response: httpx.Response) -> None:
        raw = await response.aread()
        self._ended = now = time.perf_counter()
        self.state.event_times.append(now)
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.state.fail(r.MALFORMED_CHUNK, f"unparsable body: {raw[:120]!r}")
            return
        if not isinstance(document, dict) or document.get("error") is not None:  # a response has "error": null
            self.state.fail(r.INBAND_ERROR, f"error body with a 2xx status: {raw[:_DETAIL_CHARS]!r}")
            return
        self._read_completion(document, now)

    def _read_completion(self, document: dict[str, Any], now: float) -> None:
        if document.get("type") == "message":  # the Anthropic Messages API's
            text, arguments = message_output(document)
            if text or arguments:
                self.state.output_times.append(now)
            self.state.read_message_end(document.get("stop_reason"), document.get("usage"))
            self.state.tool_args = {n: [text] for n, text in enumerate(arguments)}
            self._text_tokens = estimate_tokens(text + "".join(arguments))
            return
        if document.get("object") == "response":  # the Responses API's
            text, arguments = response_output(document)
            if text or arguments:
                self.state.output_times.append(now)
            self.state.read_response(document)
            self._text_tokens = estimate_tokens(text + "".join(arguments))
            return
        choices = document.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        message = choice.get("message")
        message = message if isinstance(message, dict) else {}
        text = "".join(value for key in _TEXT_KEYS if isinstance(value := message.get(key), str))
        arguments = _call_arguments(message.get("tool_calls"))
        if text or arguments:
            self.state.output_times.append(now)
        finish = choice.get("finish_reason")
        self.state.finish_reason = finish if isinstance(finish, str) else None
        self.state.tool_args = {n: [text] for n, text in enumerate(arguments)}
        usage = document.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        self.state.usage_tokens = tokens if isinstance(tokens, int) else None
        self._text_tokens = estimate_tokens(text + "".join(arguments))

    def timed_out(self) -> None:
        status = self.record.status
        if self.state.done:
            return  # only the end of the body was late; the answer itself was complete
        if status is not None and not 200 <= status < 300:
            self.state.fail(r.http_reason(status), f"HTTP {status} (its body did not arrive in time)")
            return
        if self._loop.time() >= self._overall:
            reason, limit = r.REQUEST_TIMEOUT, self._config.request_timeout_s
        elif self._sent is None and self.record.status is None and self._prepared.stream:
            reason, limit = r.CONNECT_TIMEOUT, self._config.first_token_timeout_s
        elif not self.state.output_times:
            reason, limit = r.FIRST_TOKEN_TIMEOUT, self._config.first_token_timeout_s
        else:
            reason, limit = r.STALL_TIMEOUT, self._config.stall_timeout_s
        self.state.fail(reason, f"client-side timeout after {limit:g} s ({reason})")

    def transport_failed(self, exc: httpx.HTTPError) -> None:
        text = f"{type(exc).__name__}: {str(exc)[:_DETAIL_CHARS]}"
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            self.state.fail(r.CONNECT_TIMEOUT, text)
        elif isinstance(exc, httpx.ConnectError):
            self.state.fail(r.CONNECT_ERROR, text)
        elif self.record.status is not None:
            # The response had started: whatever broke, the stream was cut short.
            self.state.fail(r.STREAM_CUT, text)
        else:
            self.state.fail(r.TRANSPORT_ERROR, text)

    def finish(self) -> RequestRecord:
        ended = self._ended if self._ended is not None else time.perf_counter()
        return _complete_record(self, ended)

    @property
    def sent(self) -> float:
        """When the request left; the dispatch time if the transport reports no write (mocks)."""
        return self._sent if self._sent is not None else self.dispatched

    @property
    def write_delay(self) -> float | None:
        """From the clock's start to the whole request written: event-loop time inside TTFT."""
        return self._written - self._sent if self._written is not None and self._sent is not None else None

    @property
    def expects_tool_call(self) -> bool | None:
        return self._prepared.expect_tool_call

    @property
    def headers_at(self) -> float | None:
        return self._headers

    @property
    def text_tokens(self) -> int | None:
        return self._text_tokens

    @property
    def expects_length(self) -> bool:
        return self._prepared.expect_length

    @property
    def length_is_failure(self) -> bool:
        return self._config.length_is_failure


def _call_arguments(calls: Any) -> list[str]:
    """The argument text of each tool call in a non-streamed message."""
    if not isinstance(calls, list):
        return []
    found = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        value = function.get("arguments", "") if isinstance(function, dict) else ""
        found.append(value if isinstance(value, str) else orjson.dumps(value).decode())
    return found


def _complete_record(exchange: _Exchange, ended: float) -> RequestRecord:
    record, state, sent = exchange.record, exchange.state, exchange.sent
    record.setup_s = sent - exchange.dispatched
    record.write_delay_s = exchange.write_delay
    record.expect_tool_call = exchange.expects_tool_call
    record.tool_call = bool(state.tool_args)
    record.headers_s = exchange.headers_at - sent if exchange.headers_at is not None else None
    record.event_times_s = [t - sent for t in state.event_times]
    record.output_times_s = [t - sent for t in state.output_times]
    record.finish_reason = state.finish_reason
    if record.output_times_s:
        record.ttft_s = record.output_times_s[0]
    if record.status is not None and 200 <= record.status < 300:
        record.e2e_s = ended - sent
    _count_tokens(record, state, exchange.text_tokens)
    _classify_output(record, state, exchange)
    return record


def _count_tokens(record: RequestRecord, state: StreamState, text_tokens: int | None) -> None:
    if state.usage_tokens is not None:
        record.output_tokens, record.tokens_source = state.usage_tokens, "usage"
    elif record.stream and record.output_times_s:
        record.output_tokens, record.tokens_source = len(record.output_times_s), "chunks"
    elif text_tokens is not None:
        record.output_tokens, record.tokens_source = text_tokens, "estimate"


def _classify_output(record: RequestRecord, state: StreamState, exchange: _Exchange) -> None:
    """Apply the output checks when the transport and the stream were clean; first failure wins."""
    if state.failure is None:
        invalid = first_invalid_arguments("".join(parts) for parts in state.tool_args.values())
        if state.finish_reason == "content_filter":
            state.fail(r.CONTENT_FILTER, "finish_reason content_filter")
        elif state.finish_reason == "length" and not exchange.expects_length:
            state.fail(r.LENGTH, f"finish_reason length after {record.output_tokens} tokens")
        elif not state.output_times:
            state.fail(r.EMPTY_OUTPUT, f"no content, reasoning or tool call (finish_reason {state.finish_reason})")
        elif invalid is not None:
            state.fail(r.INVALID_TOOL_ARGS, invalid)
        elif exchange.expects_tool_call and not state.tool_args:
            detail = f"expect_tool_call, but the answer had none (finish_reason {state.finish_reason})"
            state.fail(r.NO_TOOL_CALL, detail)
    if state.failure is None:
        record.ok = True
        return
    record.reason, record.detail = state.failure
    record.ok = record.reason == r.LENGTH and not exchange.length_is_failure
