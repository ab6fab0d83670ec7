"""The fast path: any server that speaks OpenAI chat completions (vLLM, SGLang, llama.cpp, OpenAI).

The upstream is always asked to stream with usage, whatever the client asked for: one code path,
a first-token deadline and stall detection that mean something, and usage for quota settlement.

Requests go through `http_transport`, a small keep-alive HTTP/1.1 client that costs a fraction of
httpx per request; httpx stays for probes and for what that client does not do (proxies from the
environment, URLs with credentials or a query, a client handed in). Either way, deadlines are
enforced around each wait on the network and disarmed while a chunk is with the consumer, so
that a slow client is never mistaken for a slow upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import urllib.request
from collections.abc import AsyncGenerator
from typing import Any, Protocol
from urllib.parse import SplitResult, urlsplit

import httpx
import orjson

from common.sse_reader import SseEvent, SseReader, SseTooLarge, is_done
from gateway.backends.base import BackendRequest, Chunk
from gateway.backends.http_transport import (
    ConnectFailed,
    ConnectionBroken,
    ConnectionPool,
    ConnectTimedOut,
    Origin,
    RequestTemplate,
    TransportError,
)
from gateway.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamInBandError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import Continuation, DeploymentSettings
from gateway.wire import chunk_from_openai

_MAX_ERROR_BODY = 16 * 1024
# After [DONE], httpx reads the body's end inline, which holds up the end of the answer: only as
# long as a prompt final chunk takes. (The transport drains in the background, within stall_s.)
_INLINE_DRAIN_S = 1.0
# A timer may fire a hair before its time (uvloop counts in milliseconds): that is on time.
_TIMER_SLACK_S = 0.001


class _Upstream(Protocol):
    """One response being read: the transport's, or httpx's behind `_HttpxResponse`."""

    status: int

    def header(self, name: str) -> str | None: ...

    async def receive(self) -> bytes: ...

    async def aclose(self, drain_s: float | None = None) -> None: ...


class OpenAICompatBackend:
    def __init__(self, deployment: DeploymentSettings, client: httpx.AsyncClient | None = None) -> None:
        self.name = deployment.name
        self._deployment = deployment
        self._timeouts = deployment.timeouts
        headers = {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
        self._client = client or httpx.AsyncClient(
            base_url=deployment.api_base,
            headers=headers,
            timeout=httpx.Timeout(
                connect=deployment.timeouts.connect_s,
                read=None,
                write=deployment.timeouts.stall_s,
                pool=deployment.timeouts.connect_s,
            ),
            limits=httpx.Limits(
                max_connections=deployment.max_inflight,
                max_keepalive_connections=deployment.max_inflight,
            ),
        )
        # vLLM-style servers say on every chunk how many tokens the answer has so far: what a
        # continuation's max_tokens and a failed attempt's usage are counted in.
        self._running_usage = deployment.continuation is Continuation.VLLM
        # A client handed in (tests, custom transports) is used for everything.
        self._direct = None if client is not None else _direct_route(deployment, headers)

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        body = {**request.body, "stream": True}
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if self._running_usage:
            body["stream_options"]["continuous_usage_stats"] = True
        deadline = _Deadline(self._timeouts.first_token_s, self._timeouts.stall_s)
        try:
            upstream = await self._send(orjson.dumps(body), request.headers, deadline)
            done = False
            try:
                if upstream.status != 200:
                    raise await self._status_error(upstream)
                sse = _SSEBody(upstream, deadline)
                while not done and (events := await sse.read()) is not None:
                    for data, _, _ in events:
                        if is_done(data):
                            done = True
                            break
                        chunk = self._parse(data)
                        if chunk.carries_output:
                            deadline.got_output()
                        yield chunk
            finally:
                # After [DONE] the body's end is read, so that the connection serves again; an
                # unfinished answer closes it, which is also what stops the upstream generating.
                await upstream.aclose(self._timeouts.stall_s if done else None)
            if not done:
                raise UpstreamProtocolError("stream ended before [DONE]", deployment=self.name)
        except SseTooLarge as exc:
            raise UpstreamProtocolError(f"the stream sent {exc}", deployment=self.name) from None
        except (TimeoutError, TransportError, httpx.HTTPError) as exc:
            translated = self._translate(exc, deadline)
            if translated is None:
                raise  # not the upstream's doing (a bad header, say): it goes up as it is
            raise translated from None
        finally:
            deadline.cancel()

    async def _send(self, payload: bytes, headers: dict[str, str], deadline: _Deadline) -> _Upstream:
        if self._direct is not None:
            pool, template = self._direct
            data = template.render(payload, headers)
            return await pool.request(data, deadline.wait, deadline.when)
        upstream = self._client.build_request(
            "POST", "/chat/completions", content=payload, headers=_json_headers(headers)
        )
        async with deadline.running():
            response = await self._client.send(upstream, stream=True)
        return _HttpxResponse(response, deadline)

    def _translate(self, exc: Exception, deadline: _Deadline) -> UpstreamError | None:
        if isinstance(exc, TimeoutError):
            limit = self._timeouts.stall_s if deadline.phase == "stall" else self._timeouts.first_token_s
            return UpstreamTimeout(
                f"no {deadline.phase.replace('_', ' ')} within {limit:g}s",
                deployment=self.name,
                phase=deadline.phase,
            )
        if isinstance(exc, ConnectTimedOut | httpx.TimeoutException):
            return UpstreamTimeout(f"connect timeout: {exc!r}", deployment=self.name, phase="connect")
        if isinstance(exc, ConnectFailed | httpx.ConnectError):
            return UpstreamConnectError(f"cannot connect: {exc!r}", deployment=self.name)
        if isinstance(exc, ConnectionBroken | httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            return UpstreamProtocolError(f"stream cut: {exc!r}", deployment=self.name)
        return None

    def _parse(self, data: bytes) -> Chunk:
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError(f"malformed chunk: {data[:200]!r}", deployment=self.name) from None
        if not isinstance(payload, dict):
            raise UpstreamProtocolError(f"malformed chunk: {data[:200]!r}", deployment=self.name)
        if "error" in payload:
            raise UpstreamInBandError(f"error event: {_error_message(payload)}", deployment=self.name)
        try:
            chunk = chunk_from_openai(payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise UpstreamProtocolError(f"malformed chunk ({exc}): {data[:200]!r}", deployment=self.name) from None
        if self._running_usage and chunk.usage is not None and payload.get("choices"):
            # A running count, not usage to add up: only the final chunk (no choices) is that.
            chunk.tokens, chunk.usage = chunk.usage.completion_tokens, None
        return chunk

    async def _status_error(self, response: _Upstream) -> UpstreamError:
        body = b""
        while len(body) <= _MAX_ERROR_BODY and (part := await response.receive()):
            body += part
        message = _error_message(_loads_or_none(body)) or body[:500].decode("utf-8", "replace")
        return UpstreamStatusError(
            f"upstream answered {response.status}: {message}",
            deployment=self.name,
            upstream_status=response.status,
            retry_after_s=_retry_after(response.header("retry-after")),
        )

    async def probe(self) -> None:
        try:
            # health_path is relative to api_base, or a full URL (vLLM's /health sits at the root).
            response = await self._client.get(self._deployment.health_path)
        except httpx.TimeoutException:
            raise UpstreamTimeout("health probe timed out", deployment=self.name, phase="connect") from None
        except httpx.HTTPError as exc:
            raise UpstreamConnectError(f"health probe failed: {exc!r}", deployment=self.name) from None
        if response.status_code >= 400:
            raise UpstreamStatusError(
                f"health probe answered {response.status_code}",
                deployment=self.name,
                upstream_status=response.status_code,
            )

    async def aclose(self) -> None:
        if self._direct is not None:
            await self._direct[0].aclose()
        await self._client.aclose()


class _Deadline:
    """The first-token deadline, then a stall deadline re-armed whenever the consumer asks for more.

    One loop timer per request rather than one `asyncio.timeout` per read: re-arming only moves
    `when`, and a timer that fires early (the deadline moved on) sets itself again. It fails the
    future the transport is waiting on, whichever task awaits it: the stream may be consumed from
    more than one task (the HTTP layer peeks the first chunk before the response starts). Between
    waits nothing can fail, so the time a chunk spends with the consumer never counts.
    """

    def __init__(self, first_token_s: float, stall_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._stall_s = stall_s
        self.when = self._loop.time() + first_token_s
        self.phase = "first_token"
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._waiting: asyncio.Future[None] | None = None

    def running(self) -> asyncio.Timeout:
        """The same deadline as a scope, for httpx's awaits: entered and left within one await."""
        return asyncio.timeout_at(self.when)

    def got_output(self) -> None:
        self.phase = "stall"

    def rearm(self) -> None:
        if self.phase == "stall":
            self.when = self._loop.time() + self._stall_s

    async def wait(self, future: asyncio.Future[None]) -> None:
        """Await `future`; at the deadline it fails with TimeoutError."""
        if self._timer_at > self.when:  # no timer, or one set for a later deadline
            self._arm()
        self._waiting = future
        try:
            await future
        finally:
            self._waiting = None

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(self.when, self._expire)
        self._timer_at = self.when

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        future = self._waiting
        if future is None or future.done():
            return  # nothing is waiting: the next wait arms the timer again
        if self._loop.time() + _TIMER_SLACK_S < self.when:
            self._arm()
            return
        future.set_exception(TimeoutError())

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()  # else it would sit in the loop's heap until the deadline
        self._timer, self._timer_at = None, math.inf


class _SSEBody:
    """The events of an SSE body, read from the network only as the consumer asks for more."""

    def __init__(self, body: _Upstream, deadline: _Deadline) -> None:
        self._body = body
        self._deadline = deadline
        self._reader: SseReader | None = SseReader()
        self._started = False

    async def read(self) -> list[SseEvent] | None:
        """The events the next network read completed (perhaps none); None once the body has ended."""
        reader = self._reader
        if reader is None:
            return None
        if self._started:
            self._deadline.rearm()  # the consumer is back: the stall clock starts from now
        self._started = True
        part = await self._body.receive()
        if part:
            return reader.feed(part)
        self._reader = None
        return reader.close()


class _HttpxResponse:
    """An httpx response behind the transport's response interface, read within the deadline."""

    def __init__(self, response: httpx.Response, deadline: _Deadline) -> None:
        self.status = response.status_code
        self._response = response
        self._deadline = deadline
        self._parts = response.aiter_bytes()  # decoded: an upstream may compress its SSE

    def header(self, name: str) -> str | None:
        value: str | None = self._response.headers.get(name)
        return value

    async def receive(self) -> bytes:
        async with self._deadline.running():
            return await anext(self._parts, b"")

    async def aclose(self, drain_s: float | None = None) -> None:
        if drain_s is not None:
            # Read to the end so that httpcore keeps the connection (it drops an unread one).
            with contextlib.suppress(httpx.HTTPError, TimeoutError):
                async with asyncio.timeout(min(drain_s, _INLINE_DRAIN_S)):
                    async for _ in self._parts:
                        pass
        await self._response.aclose()


def _direct_route(
    deployment: DeploymentSettings, headers: dict[str, str]
) -> tuple[ConnectionPool, RequestTemplate] | None:
    """The transport's pool and request for this deployment, or None where httpx must do it."""
    url = urlsplit(str(deployment.api_base))
    if url.scheme not in ("http", "https") or not url.hostname or url.username or url.password:
        return None
    if url.query or url.fragment or _proxied(url):
        return None
    fixed = {**headers, **_json_headers({}), "accept-encoding": "gzip, deflate", "user-agent": "agent-gateway"}
    try:
        template = RequestTemplate("POST", url.path.rstrip("/") + "/chat/completions", url.netloc, fixed)
    except ValueError:
        return None  # a key that is no valid header: httpx refuses each request, as it always did
    tls = None
    if url.scheme == "https":
        tls = httpx.create_ssl_context()  # the trust store httpx would use (certifi, SSL_CERT_FILE)
        tls.set_alpn_protocols(["http/1.1"])
    origin = Origin(url.hostname, url.port or (443 if tls else 80), tls)
    pool = ConnectionPool(
        origin, max_connections=deployment.max_inflight, connect_timeout_s=deployment.timeouts.connect_s
    )
    return pool, template


def _proxied(url: SplitResult) -> bool:
    """Whether the environment sends this URL through a proxy, as httpx (trust_env) would."""
    proxies = urllib.request.getproxies()
    if not (proxies.get(url.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(url.hostname or "")


def _json_headers(headers: dict[str, str]) -> dict[str, str]:
    return {"content-type": "application/json", "accept": "text/event-stream", **headers}


def _loads_or_none(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _error_message(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or error)
        if error is not None:
            return str(error)
    return ""


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date; rare from model servers, and the backoff covers it
