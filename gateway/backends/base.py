"""The backend seam: one request in, an async stream of normalized chunks out (for an embeddings
request, one chunk carrying them).

Every upstream call goes through `Backend.stream`. A backend translates its transport's failures
into `gateway.errors.UpstreamError` subclasses; the router never sees httpx or litellm exceptions.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.chunks import Chunk


@dataclass(frozen=True, slots=True)
class BackendRequest:
    """An OpenAI chat-completions body already addressed to one deployment (its model name)."""

    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)
    # "chat": stream a chat completion; "embeddings": one chunk whose `extra` holds the embeddings
    # (`data`) and whose usage counts the input (settings.Operation's values).
    operation: str = "chat"


class Backend(Protocol):
    """One deployment's transport. Implementations: OpenAI-compatible over httpx, litellm."""

    name: str

    def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        """Yield chunks until the upstream finishes; raise `UpstreamError` on any failure.

        The stream ends normally only when the upstream signalled completion ([DONE] or
        equivalent): a cut connection is an error, never a short answer.
        """
        ...

    async def probe(self) -> None:
        """Cheap liveness check for active health probes; raise `UpstreamError` if unhealthy."""
        ...

    def cut_idle(self, idle_s: float) -> int:
        """End every wait of this backend's streams that has had no data for `idle_s` with a
        retryable `UpstreamTimeout` (its breaker just opened on a stall); how many were cut."""
        ...

    async def aclose(self) -> None: ...
