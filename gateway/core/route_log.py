"""What routing did for one request: its attempts at deployments and its mid-stream hand-overs.

The router writes it; the audit, telemetry and session stages read it, so it lives in the kernel
(the request trace once imported it from the router, which imports the trace: a circle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.core.chunks import Usage


@dataclass(slots=True)
class Attempt:
    deployment: str
    error: str | None = None  # UpstreamError.reason, None while running or on success
    ttft_s: float | None = None
    output_chunks: int = 0
    tpot_s: float | None = None
    usage: Usage | None = None  # as the upstream reported it
    finish_reason: str | None = None


@dataclass(slots=True)
class RouteLog:
    """What routing did for one request; read by the audit and telemetry stages."""

    attempts: list[Attempt] = field(default_factory=list)
    failovers: int = 0  # mid-stream hand-overs to another deployment

    @property
    def deployment(self) -> str | None:
        return self.attempts[-1].deployment if self.attempts else None
