"""What the rest of the gateway (readiness, metrics) knows of an upstream MCP server; importing
it does not import the MCP SDK."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class UpstreamState(StrEnum):
    STARTING = "starting"
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    name: str
    state: UpstreamState
    tools: int
    restarts: int
    last_error: str
