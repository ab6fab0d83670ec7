"""The fast path: any server that speaks OpenAI chat completions (vLLM, SGLang, llama.cpp, OpenAI).

One `httpx.AsyncClient` per deployment keeps connections warm. The upstream is always asked to
stream with usage, whatever the client asked for: one code path, a first-token deadline and stall
detection that mean something, and usage for quota settlement. httpx's own read timeout is off;
deadlines are enforced around each read with one rescheduled `asyncio.Timeout`, and disarmed
while the chunk is with the consumer so that a slow client is never mistaken for a slow upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import orjson

from gateway.backends.base import BackendRequest, Chunk
from gateway.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamInBandError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import DeploymentSettings
from gateway.wire import chunk_from_openai

_DONE = b"[DONE]"
_MAX_ERROR_BODY = 16 * 1024


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

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        body = {**request.body, "stream": True}
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        deadline = _Deadline(self._timeouts.first_token_s, self._timeouts.stall_s)
        upstream = self._client.build_request(
            "POST", "/chat/completions", content=orjson.dumps(body), headers=_json_headers(request)
        )
        try:
            async with deadline.running():
                response = await self._client.send(upstream, stream=True)
            try:
                if response.status_code != 200:
                    raise await self._status_error(response)
                async for data in _sse_data(response, deadline):
                    if data == _DONE:
                        return
                    chunk = self._parse(data)
                    if chunk.carries_output:
                        deadline.got_output()
                    yield chunk
            finally:
                await response.aclose()
            raise UpstreamProtocolError("stream ended before [DONE]", deployment=self.name)
        except TimeoutError:
            limit = self._timeouts.stall_s if deadline.phase == "stall" else self._timeouts.first_token_s
            raise UpstreamTimeout(
                f"no {deadline.phase.replace('_', ' ')} within {limit:g}s",
                deployment=self.name,
                phase=deadline.phase,
            ) from None
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(
                f"connect timeout: {exc!r}", deployment=self.name, phase="connect"
            ) from None
        except httpx.ConnectError as exc:
            raise UpstreamConnectError(f"cannot connect: {exc!r}", deployment=self.name) from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise UpstreamProtocolError(f"stream cut: {exc!r}", deployment=self.name) from None

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
            return chunk_from_openai(payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise UpstreamProtocolError(
                f"malformed chunk ({exc}): {data[:200]!r}", deployment=self.name
            ) from None

    async def _status_error(self, response: httpx.Response) -> UpstreamError:
        body = b""
        async for part in response.aiter_bytes():
            body += part
            if len(body) > _MAX_ERROR_BODY:
                break
        message = _error_message(_loads_or_none(body)) or body[:500].decode("utf-8", "replace")
        return UpstreamStatusError(
            f"upstream answered {response.status_code}: {message}",
            deployment=self.name,
            upstream_status=response.status_code,
            retry_after_s=_retry_after(response.headers.get("retry-after")),
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
        await self._client.aclose()


class _Deadline:
    """The first-token deadline, then a stall deadline re-armed after every chunk.

    Each wait on the network gets its own short-lived `asyncio.timeout`, entered and left inside
    one await: the stream may be consumed from more than one task (the HTTP layer peeks the first
    chunk before the response starts), and the time a chunk spends with the consumer must never
    count against the upstream.
    """

    def __init__(self, first_token_s: float, stall_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._stall_s = stall_s
        self._when = self._loop.time() + first_token_s
        self.phase = "first_token"

    def running(self) -> asyncio.Timeout:
        return asyncio.timeout_at(self._when)

    def got_output(self) -> None:
        self.phase = "stall"

    def rearm(self) -> None:
        if self.phase == "stall":
            self._when = self._loop.time() + self._stall_s


async def _sse_data(response: httpx.Response, deadline: _Deadline) -> AsyncIterator[bytes]:
    """Yield the payload of each `data:` line of an SSE body."""
    buffer = b""
    chunks = response.aiter_bytes()  # decoded: an upstream may compress its SSE
    while True:
        try:
            async with deadline.running():
                part = await anext(chunks)
        except StopAsyncIteration:
            return
        buffer += part
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):  # skips comments (keep-alives), event names, separators
                yield line[5:].strip()
        deadline.rearm()


def _json_headers(request: BackendRequest) -> dict[str, str]:
    return {"content-type": "application/json", "accept": "text/event-stream", **request.headers}


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
