"""Providers that do not speak the OpenAI protocol (Anthropic, Bedrock, Vertex, ...), through litellm.

The only module that imports litellm, and it does so lazily: the import costs seconds and
~190 MB, so a gateway that configures no such deployment never pays it. litellm's exceptions are
translated here into the gateway's own; nothing above this module sees them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

from gateway.backends.base import BackendRequest
from gateway.core.chunks import Chunk
from gateway.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import DeploymentSettings
from gateway.wire import chunk_from_openai

# Parameters litellm maps per provider; everything else in the client body is dropped for
# these providers, because they would reject what they do not know.
_FORWARDED = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
)


def _openai_error() -> type[Exception]:
    """The base class of what litellm raises. Not `litellm.exceptions.OpenAIError`: litellm's
    mapped exceptions (InternalServerError, AuthenticationError, ...) derive from the openai
    package's classes, not from that one, and escaped as 500s."""
    import openai  # litellm depends on it

    return openai.OpenAIError


def _import_litellm() -> Any:
    # The cost map is fetched from the internet at import unless told otherwise, and litellm
    # reports telemetry by default: neither belongs in a gateway.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    # litellm logs every call at INFO (with placeholder objects for redacted fields): our own
    # request log says the same, so only its warnings are kept.
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    return litellm


class LiteLLMBackend:
    def __init__(self, deployment: DeploymentSettings) -> None:
        self.name = deployment.name
        self._deployment = deployment
        self._litellm = _import_litellm()

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        body = request.body
        timeouts = self._deployment.timeouts
        kwargs: dict[str, Any] = {k: body[k] for k in _FORWARDED if k in body}
        try:
            async with asyncio.timeout(timeouts.first_token_s):
                response = await self._litellm.acompletion(
                    model=self._deployment.model,
                    messages=body["messages"],
                    stream=True,
                    stream_options={"include_usage": True},
                    api_base=self._deployment.api_base,
                    api_key=self._deployment.api_key or None,
                    timeout=timeouts.stall_s,
                    drop_params=True,
                    max_retries=0,  # the router retries, across deployments, within its deadline
                    extra_headers=dict(request.headers) or None,
                    **kwargs,
                )
            iterator = aiter(response)
            phase, limit = "first_token", timeouts.first_token_s
            while True:
                try:
                    async with asyncio.timeout(limit):
                        item = await anext(iterator)
                except StopAsyncIteration:
                    return
                try:
                    chunk = chunk_from_openai(item.model_dump(exclude_none=True))
                except (KeyError, TypeError, ValueError) as exc:
                    raise UpstreamProtocolError(f"malformed chunk ({exc})", deployment=self.name) from None
                if chunk.carries_output:
                    phase, limit = "stall", timeouts.stall_s
                yield chunk
        except TimeoutError:
            raise UpstreamTimeout(
                f"no {phase.replace('_', ' ')} within {limit:g}s",
                deployment=self.name,
                phase=phase,
                deployment_limit=True,
            ) from None
        except _openai_error() as exc:
            raise self._translate(exc) from None

    def _translate(self, exc: Exception) -> UpstreamError:
        errors = self._litellm.exceptions
        if isinstance(exc, errors.Timeout):
            return UpstreamTimeout(str(exc), deployment=self.name, phase="connect")
        if isinstance(exc, errors.APIConnectionError):
            return UpstreamConnectError(str(exc), deployment=self.name)
        status = getattr(exc, "status_code", None)
        if isinstance(status, int):
            retry_after = _retry_after(getattr(exc, "response", None))
            return UpstreamStatusError(
                str(exc), deployment=self.name, upstream_status=status, retry_after_s=retry_after
            )
        return UpstreamProtocolError(str(exc), deployment=self.name)

    async def probe(self) -> None:
        # Most providers behind litellm have no free health endpoint; the breaker and passive
        # latency statistics watch them instead.
        return None

    def cut_idle(self, idle_s: float) -> int:
        # litellm's client owns its waits: these streams end at their own stall_s.
        return 0

    async def aclose(self) -> None:
        return None


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
