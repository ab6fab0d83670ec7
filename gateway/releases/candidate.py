"""What a preflight needs of the candidate release's traffic, and what the HTTP layer provides.

The eval gate must see what users will get: the release's system prompt, its deployments and the
tool policy. So the eval cases go through the gateway's own request path, pinned to the candidate
by the `X-Gateway-Release` header; the replay smoke run goes through the same path over real HTTP,
on a one-time local listener. Building that path and serving it belong to the app and the HTTP
layer (`http/candidate_app.py`, handed in by `app.py`); the release service sees only this seam.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import httpx

    from gateway.core.principal import Principal

RELEASE_HEADER = "x-gateway-release"
# The base URL eval runners are given; the transport never opens a socket, the host is a label.
BASE_URL = "http://gateway.preflight/v1"


@dataclass(frozen=True, slots=True)
class Listener:
    base_url: str  # http://127.0.0.1:PORT/v1
    token: str = field(repr=False)  # the one bearer token it accepts: kept out of logs and tracebacks


class ListenerNotStarted(Exception):
    """The listener could not be opened or its server did not come up; the message says why."""


class CandidateTraffic(Protocol):
    def transport(self, actor: Principal, version: str) -> httpx.AsyncBaseTransport:
        """In process, `actor` as the caller: for the eval cases, which need whole responses only."""
        ...

    def listener(self, actor: Principal, version: str) -> AbstractAsyncContextManager[Listener]:
        """The same path on 127.0.0.1 behind a one-time token, until the block ends; raises
        ListenerNotStarted on entering if it cannot be opened."""
        ...
