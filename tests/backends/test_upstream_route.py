"""Which upstreams go through a proxy from the environment: the choice httpx (trust_env) made."""

from __future__ import annotations

import httpx
import pytest

from gateway.backends.upstream_route import Route, environment_proxy


@pytest.mark.parametrize(
    "no_proxy",
    ["", "*", "upstream.test", ".upstream.test", "test", "api.upstream.test", "127.0.0.1", "::1", "localhost",
     "http://upstream.test", "https://upstream.test", "all://*.upstream.test", "all://*upstream.test",
     "http://upstream.test:8000", "http://upstream.test:80", "https://upstream.test:443",
     " other.test , upstream.test ", "upstream.test:8000", "upstream.test:80", "api.upstream.test:8000",
     "127.0.0.1:8000", "127.0.0.1:80", "localhost:80", "10.0.0.0/8"],
)  # fmt: skip
@pytest.mark.parametrize(
    "url",
    ["http://upstream.test/v1", "https://upstream.test/v1", "http://api.upstream.test:8000/v1",
     "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1", "http://localhost/v1", "http://notupstream.test/v1",
     "http://upstream.test:8000/v1"],
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


def test_a_tunnel_does_not_show_the_proxys_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://agent:s3cret@proxy.test:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    route = Route("https://upstream.test/v1", max_connections=1, connect_timeout_s=1.0)
    assert "s3cret" not in repr(route.pool._origin)
    assert "YWdlbnQ6czNjcmV0" not in repr(route.pool._origin)  # base64 of agent:s3cret


def test_a_url_that_is_not_http_is_refused_without_quoting_its_credentials() -> None:
    with pytest.raises(ValueError, match="not an http") as refused:
        Route("ftp://agent:s3cret@files.test/v1", max_connections=1, connect_timeout_s=1.0)
    assert "s3cret" not in str(refused.value)
