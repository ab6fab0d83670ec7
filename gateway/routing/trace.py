"""What the router reports about one request's attempts: a seam that telemetry implements.

Routing must not depend on telemetry (telemetry reads routing's state for its gauges), so the
router talks to these two small protocols. Code that makes a route without telemetry (tests,
the takeover path built by hand) passes nothing and gets the inert `UntracedRoute`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.core.route_log import Attempt
    from gateway.routing.deployment import Deployment


class AttemptSpan(Protocol):
    """One upstream attempt, used as a context manager around it; `headers` carry its trace
    context to the upstream. On exit it reads what the router recorded on the `Attempt`."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def __enter__(self) -> AttemptSpan: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class RouteTrace(Protocol):
    def attempt(
        self, model: str, deployment: Deployment, attempt: Attempt, number: int, body: Mapping[str, Any]
    ) -> AttemptSpan: ...

    def retry(self, deployment: str, reason: str, number: int) -> None:
        """Another attempt, before any output: `reason` is why the previous one failed."""

    def failover(self, deployment: str, reason: str, output_chunks: int, count: int) -> None:
        """A mid-stream hand-over: `deployment` failed after output and another one continues."""


_NO_HEADERS: Mapping[str, str] = {}


class UntracedAttempt:
    __slots__ = ()

    @property
    def headers(self) -> Mapping[str, str]:
        return _NO_HEADERS

    def __enter__(self) -> UntracedAttempt:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class UntracedRoute:
    """Hears nothing, sends no trace headers."""

    __slots__ = ()

    def attempt(
        self, model: str, deployment: Deployment, attempt: Attempt, number: int, body: Mapping[str, Any]
    ) -> UntracedAttempt:
        return UntracedAttempt()

    def retry(self, deployment: str, reason: str, number: int) -> None:
        return None

    def failover(self, deployment: str, reason: str, output_chunks: int, count: int) -> None:
        return None
