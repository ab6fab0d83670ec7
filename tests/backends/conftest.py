from __future__ import annotations

import pytest

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxies_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend honours proxy variables as httpx did: a test sets its own, or none."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
