"""Which upstreams go through a proxy from the environment: the choice httpx (trust_env) made."""

from __future__ import annotations

import httpx
import pytest

from gateway.backends.upstream_route import environment_proxy


@pytest.mark.parametrize(
    "no_proxy",
    ["", "*", "upstream.test", ".upstream.test", "test", "api.upstream.test", "127.0.0.1", "::1", "localhost",
     "http://upstream.test", "https://upstream.test", "all://*.upstream.test", "all://*upstream.test",
     "http://upstream.test:8000", "http://upstream.test:80", "https://upstream.test:443",
     " other.test , upstream.test "],
)  # fmt: skip
@pytest.mark.parametrize(
    "url",
    ["http://upstream.test/v1", "https://upstream.test/v1", "http://api.upstream.test:8000/v1",
     "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1", "http://localhost/v1", "http://notupstream.test/v1"],
)  # fmt: skip
def test_proxy_choice_is_the_one_httpx_made(no_proxy: str, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("ALL_PROXY", "proxy.test:3129")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    client = httpx.Client(verify=False)  # the trust store plays no part in choosing a proxy, and is slow to load
    proxied_by_httpx = client._transport_for_url(httpx.URL(url)) is not client._transport
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    assert (environment_proxy(parsed.scheme, parsed.host, port) is not None) == proxied_by_httpx
