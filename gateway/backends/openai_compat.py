"""The fast path: any server that speaks OpenAI chat completions (vLLM, SGLang, llama.cpp, OpenAI).

The upstream is always asked to stream with usage, whatever the client asked for: one code path,
a first-token deadline and stall detection that mean something, and usage for quota settlement.

Every request, health probes included, goes through `http_transport`, a small keep-alive HTTP/1.1
client that costs a fraction of httpx per request, along the route `upstream_route` works out
(proxies from the environment, credentials in the URL, the trust store for https). Deadlines are
enforced around each wait on the network and disarmed while a chunk is with the consumer, so
that a slow client is never mistaken for a slow upstream.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from common.sse_reader import SseEvent, SseReader, SseTooLarge, is_done
from gateway.backends.base import BackendRequest
from gateway.backends.coalesce import Coalescer
from gateway.backends.http_transport import (
    ConnectFailed,
    ConnectionBroken,
    ConnectTimedOut,
    RequestTemplate,
    Response,
    TransportError,
)
from gateway.backends.upstream_route import Route
from gateway.core.chunks import Chunk, Usage
from gateway.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamInBandError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import Continuation, DeploymentSettings
from gateway.wire import chunk_from_openai, plain_text

_MAX_ERROR_BODY = 16 * 1024
_MAX_EMBEDDINGS_BODY = 64 * 1024 * 1024  # 2048 inputs of 3072 floats as JSON, with room
# A health answer is read whole (a 200 whose body never ends is no answer), up to this size.
_MAX_PROBE_BODY = 1024 * 1024
# A timer may fire a hair before its time (uvloop counts in milliseconds): that is on time.
_TIMER_SLACK_S = 0.001

log = logging.getLogger("gateway.backends")


class OpenAICompatBackend:
    def __init__(self, deployment: DeploymentSettings) -> None:
        self.name = deployment.name
        self._deployment = deployment
        self._timeouts = deployment.timeouts
        headers = {"authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
        # One connection more than the router lets requests use: a busy deployment's health probe
        # does not wait for a free connection, and is not failed for being busy.
        self._route = Route(
            str(deployment.api_base),
            max_connections=deployment.max_inflight + 1,
            connect_timeout_s=deployment.timeouts.connect_s,
        )
        fixed = {**headers, "accept-encoding": "gzip, deflate", "user-agent": "agent-gateway"}
        json_headers = {**fixed, "content-type": "application/json", "accept": "text/event-stream"}
        self._chat = _template_or_error(self._route, "POST", self._route.path + "/chat/completions", json_headers)
        answer_headers = {**json_headers, "accept": "application/json"}
        self._embeddings = _template_or_error(self._route, "POST", self._route.path + "/embeddings", answer_headers)
        self._health = _health_request(self._route, deployment, fixed)
        # vLLM-style servers say on every chunk how many tokens the answer has so far: what a
        # continuation's max_tokens and a failed attempt's usage are counted in.
        self._running_usage = deployment.continuation is Continuation.VLLM
        # The deadlines of the streams in flight, so that a stall of one can cut the others (cut_idle).
        self._live: set[_Deadline] = set()

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        if request.operation == "embeddings":
            yield await self._embed(request)
            return
        body = {**request.body, "stream": True}
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if self._running_usage:
            body["stream_options"]["continuous_usage_stats"] = True
        deadline = _Deadline(self._timeouts.first_token_s, self._timeouts.stall_s)
        self._live.add(deadline)
        try:
            upstream = await self._send(orjson.dumps(body), request.headers, deadline)
            done = False
            try:
                if upstream.status != 200:
                    raise await self._status_error(upstream)
                sse = _SSEBody(upstream, deadline)
                # A client that asked for one answer never sees chunk boundaries; a streaming client
                # gets them back from the joined chunk's pieces (coalesce.py).
                coalescer = Coalescer(self._running_usage)
                while not done and (events := await sse.read()) is not None:
                    read: list[Chunk | str] = []
                    for data, _, _ in events:
                        if is_done(data):
                            done = True
                            break
                        read.append(self._parse(data))
                    for chunk in coalescer.join(read):
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
        except (TimeoutError, TransportError) as exc:
            translated = self._translate(exc, deadline)
            if translated is None:
                raise  # not the upstream's doing (a bad header, say): it goes up as it is
            raise translated from None
        finally:
            self._live.discard(deadline)
            deadline.cancel()

    async def _embed(self, request: BackendRequest) -> Chunk:
        """POST /embeddings, the whole answer read within the first-token deadline: one chunk with
        the embeddings (`extra["data"]`) and the input's usage."""
        deadline = _Deadline(self._timeouts.first_token_s, self._timeouts.stall_s)
        self._live.add(deadline)
        try:
            upstream = await self._send(orjson.dumps(request.body), request.headers, deadline, self._embeddings)
            try:
                if upstream.status != 200:
                    raise await self._status_error(upstream)
                body = b""
                while part := await upstream.receive():
                    body += part
                    if len(body) > _MAX_EMBEDDINGS_BODY:
                        raise UpstreamProtocolError(
                            f"embeddings over {_MAX_EMBEDDINGS_BODY} bytes", deployment=self.name
                        )
            finally:
                await upstream.aclose(self._timeouts.stall_s)
        except (TimeoutError, TransportError) as exc:
            translated = self._translate(exc, deadline)
            if translated is None:
                raise
            raise translated from None
        finally:
            self._live.discard(deadline)
            deadline.cancel()
        return self._embeddings_chunk(body)

    def _embeddings_chunk(self, body: bytes) -> Chunk:
        answer = _loads_or_none(body)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise UpstreamProtocolError(f"embeddings answer without a data list: {body[:200]!r}", deployment=self.name)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        tokens = prompt if isinstance(prompt, int) and prompt >= 0 else 0
        return Chunk(finish_reason="stop", usage=Usage(prompt_tokens=tokens, total_tokens=tokens), extra={"data": data})

    def cut_idle(self, idle_s: float) -> int:
        return sum(deadline.cut(idle_s) for deadline in list(self._live))

    async def _send(
        self,
        payload: bytes,
        headers: Mapping[str, str],
        deadline: _Deadline,
        template: RequestTemplate | ValueError | None = None,
    ) -> Response:
        """POST `payload` with the chat request's head, or `template`'s."""
        template = self._chat if template is None else template
        if isinstance(template, ValueError):
            raise template  # a key that is no valid header: not the upstream's doing, nor retryable
        data = template.render(payload, headers)
        return await self._route.pool.request(data, deadline.wait, deadline.when)

    def _translate(self, exc: Exception, deadline: _Deadline) -> UpstreamError | None:
        if isinstance(exc, TimeoutError):
            if deadline.was_cut:
                return UpstreamTimeout(
                    "cut: another request's stall opened the breaker", deployment=self.name, phase=deadline.phase
                )
            limit = self._timeouts.stall_s if deadline.phase == "stall" else self._timeouts.first_token_s
            return UpstreamTimeout(
                f"no {deadline.phase.replace('_', ' ')} within {limit:g}s",
                deployment=self.name,
                phase=deadline.phase,
                deployment_limit=True,
            )
        if isinstance(exc, ConnectTimedOut):
            return UpstreamTimeout(f"connect timeout: {exc!r}", deployment=self.name, phase="connect")
        if isinstance(exc, ConnectFailed):
            return UpstreamConnectError(f"cannot connect: {exc!r}", deployment=self.name)
        if isinstance(exc, ConnectionBroken):
            return UpstreamProtocolError(f"stream cut: {exc!r}", deployment=self.name)
        return None

    def _parse(self, data: bytes) -> Chunk | str:
        """The chunk in one event; most are plain text, returned as the str (coalesce.py)."""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError(f"malformed chunk: {data[:200]!r}", deployment=self.name) from None
        if not isinstance(payload, dict):
            raise UpstreamProtocolError(f"malformed chunk: {data[:200]!r}", deployment=self.name)
        text = plain_text(payload)
        if text is not None:
            return text
        if "error" in payload:
            raise UpstreamInBandError(f"error event: {_error_message(payload)}", deployment=self.name)
        try:
            chunk = chunk_from_openai(payload)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # AttributeError: a list or str for an object
            raise UpstreamProtocolError(f"malformed chunk ({exc}): {data[:200]!r}", deployment=self.name) from None
        if chunk.usage is not None and not chunk.usage.trusted:
            # Answered all the same: the gateway's own count stands in (gateway/tokens.py).
            log.warning("deployment %s reported usage no answer can have: %.200r", self.name, payload.get("usage"))
        if self._running_usage and chunk.usage is not None and payload.get("choices"):
            # A running count, not usage to add up: only the final chunk (no choices) is that.
            chunk.tokens, chunk.usage = chunk.usage.completion_tokens, None
        return chunk

    async def _status_error(self, response: Response) -> UpstreamError:
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
        """GET health_path through the request pool and read the whole answer (at most 1 MiB; a
        JSON one must parse). A body that never ends is bounded by the caller's timeout (the
        health monitor's `timeout_s`) and, failing that, the first-token deadline."""
        route, template = self._health
        if isinstance(template, ValueError):
            raise UpstreamConnectError(f"health probe failed: {template}", deployment=self.name)
        deadline = _Deadline(self._timeouts.first_token_s, self._timeouts.stall_s)
        try:
            response = await route.pool.request(template.render(b""), deadline.wait, deadline.when)
            try:
                if response.status >= 400:
                    raise UpstreamStatusError(
                        f"health probe answered {response.status}",
                        deployment=self.name,
                        upstream_status=response.status,
                    )
                content_type = response.header("content-type")
                body = await _bounded_body(response, _MAX_PROBE_BODY)
            finally:
                await response.aclose()  # read to its end, it serves again; else it is closed
        except ConnectTimedOut:
            raise UpstreamTimeout("health probe timed out", deployment=self.name, phase="connect") from None
        except TimeoutError:  # connected, but no (whole) answer in time: slow, not unreachable
            raise UpstreamTimeout("health probe timed out", deployment=self.name, phase="first_token") from None
        except TransportError as exc:
            raise UpstreamConnectError(f"health probe failed: {exc!r}", deployment=self.name) from None
        finally:
            deadline.cancel()
        self._check_probe_body(body, content_type)

    def _check_probe_body(self, body: bytes | None, content_type: str | None) -> None:
        if body is None:
            raise UpstreamProtocolError(f"health probe answer over {_MAX_PROBE_BODY} bytes", deployment=self.name)
        media = (content_type or "").partition(";")[0].strip().lower()
        # An empty body is an answer (vLLM's /health sends none); JSON that is there must parse.
        if body and (media == "application/json" or media.endswith("+json")) and not _parses(body):
            raise UpstreamProtocolError("health probe answer is not valid JSON", deployment=self.name)

    async def aclose(self) -> None:
        await self._route.pool.aclose()
        probe_route = self._health[0]
        if probe_route.pool is not self._route.pool:
            await probe_route.pool.aclose()


class _Deadline:
    """The first-token deadline, then a stall deadline re-armed whenever the consumer asks for more
    after a read that completed an event (comments and keep-alives do not count).

    One loop timer per request rather than one `asyncio.timeout` per read: re-arming only moves
    `when`, and a timer that fires early (the deadline moved on) sets itself again. It fails the
    future the transport is waiting on, whichever task awaits it: the stream may be consumed from
    more than one task (the HTTP layer peeks the first chunk before the response starts). Between
    waits nothing can fail, so the time a chunk spends with the consumer never counts.
    """

    def __init__(self, first_token_s: float, stall_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._stall_s = stall_s
        self.since = self._loop.time()  # the start, then the last re-arm: when data last came
        self.when = self.since + first_token_s
        self.phase = "first_token"
        self.was_cut = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._waiting: asyncio.Future[None] | None = None

    def got_output(self) -> None:
        self.phase = "stall"

    def rearm(self) -> None:
        if self.phase == "stall":
            self.since = self._loop.time()
            self.when = self.since + self._stall_s

    def cut(self, idle_s: float) -> bool:
        """Fail the wait now if it has had no data for `idle_s` (another request's stall opened
        the deployment's breaker); a stream whose chunk is with its consumer is left alone."""
        future = self._waiting
        if future is None or future.done() or self._loop.time() - self.since < idle_s:
            return False
        self.was_cut = True
        future.set_exception(TimeoutError())
        return True

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

    def __init__(self, body: Response, deadline: _Deadline) -> None:
        self._body = body
        self._deadline = deadline
        self._reader: SseReader | None = SseReader()
        self._data = False  # the last read completed an event: only data re-arms the stall clock

    async def read(self) -> list[SseEvent] | None:
        """The events the next network read completed (perhaps none); None once the body has ended."""
        reader = self._reader
        if reader is None:
            return None
        if self._data:
            # The consumer is back after data: the stall clock starts from now. Comments and
            # keep-alives (reads that complete no event) do not move it: a server that sends
            # only those is as stalled as a silent one.
            self._deadline.rearm()
        part = await self._body.receive()
        events = reader.feed(part) if part else reader.close()
        if not part:
            self._reader = None
        self._data = bool(events)
        return events


def _template_or_error(route: Route, method: str, path: str, headers: dict[str, str]) -> RequestTemplate | ValueError:
    """The request, or why it cannot be sent (a key that is no valid header): each request raises it."""
    try:
        return route.template(method, path, headers)
    except ValueError as exc:
        return exc


def _health_request(
    route: Route, deployment: DeploymentSettings, headers: dict[str, str]
) -> tuple[Route, RequestTemplate | ValueError]:
    """health_path is relative to api_base, or a full URL (vLLM's /health sits at the root); a
    full URL on the same origin shares the request pool."""
    path = deployment.health_path
    if not urlsplit(path).scheme:  # a path (settings allow only a path or an http(s) URL)
        return route, _template_or_error(route, "GET", f"{route.path}/{path.lstrip('/')}", headers)
    health = Route(path, max_connections=1, connect_timeout_s=deployment.timeouts.connect_s, share=route)
    return health, _template_or_error(health, "GET", health.path or "/", headers)


async def _bounded_body(response: Response, limit: int) -> bytes | None:
    """The whole body, or None once it passes `limit` bytes."""
    body = bytearray()
    while part := await response.receive():
        body += part
        if len(body) > limit:
            return None
    return bytes(body)


def _parses(body: bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


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
