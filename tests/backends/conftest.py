from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxies_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend honours proxy variables as httpx did: a test sets its own, or none."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every test on both loops: the gateway serves on uvloop where it is installed, and the client
    leans on what loops differ in (transports, TLS, timers, collecting an abandoned generator)."""
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
