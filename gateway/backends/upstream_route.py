"""Where a deployment's requests go, worked out once from its URL and the environment.

The backend used httpx (trust_env, its default) for what the small client could not do; this is
what httpx took from the URL and the environment, resolved the same way, so that every request
takes the one client:

- HTTP_PROXY / HTTPS_PROXY / ALL_PROXY and NO_PROXY (either case), read and matched as httpx
  does: a plain http upstream is asked for through the proxy (absolute-form request line), an
  https one through a CONNECT tunnel with TLS to the upstream inside it. Only http:// proxies:
  through another (https://, socks5://) every request fails as a connect error that says so,
  rather than going around it; the other deployments serve on.
- Credentials in the URL become basic auth, which takes the place of the bearer key, as in httpx;
  a proxy's credentials become Proxy-Authorization.
- The trust store for https is httpx's (certifi, or SSL_CERT_FILE / SSL_CERT_DIR when set).
- A query in the URL (Azure's api-version) goes on every request, after the path. (httpx put the
  path after the query, which no server understood.)
"""

from __future__ import annotations

import base64
import ipaddress
import urllib.request
from urllib.parse import SplitResult, unquote, urlsplit

import httpx

from gateway.backends.http_transport import ConnectionPool, Origin, RequestTemplate, Tunnel


class Route:
    """One upstream URL: the pool that reaches its origin, and the requests it is sent."""

    def __init__(self, url: str, *, max_connections: int, connect_timeout_s: float, share: Route | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # Named without its credentials or path: this message reaches logs.
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.hostname or ''}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.key = (parts.scheme, parts.hostname.lower(), port)
        self.path = parts.path.rstrip("/")
        self._query = f"?{parts.query}" if parts.query else ""
        self._host = parts.netloc.rpartition("@")[2]  # the Host header: no credentials in it
        self._headers: dict[str, str] = {}
        if parts.username is not None or parts.password is not None:
            self._headers["authorization"] = _basic(parts.username, parts.password)
        self._prefix = ""  # the scheme and authority, when a forward proxy needs the absolute URL
        self._proxy_headers: dict[str, str] = {}
        self.pool: ConnectionPool
        if share is not None and share.key == self.key:
            self.pool = share.pool  # the same origin: one pool, whatever the path
            self._prefix, self._proxy_headers = share._prefix, share._proxy_headers
            return
        origin = self._origin(parts, port)
        self.pool = ConnectionPool(origin, max_connections=max_connections, connect_timeout_s=connect_timeout_s)

    def template(self, method: str, path: str, headers: dict[str, str]) -> RequestTemplate:
        """A request for `path` (after the URL's own path); raises ValueError for a header it cannot send."""
        target = f"{self._prefix}{path}{self._query}"
        return RequestTemplate(method, target, self._host, {**headers, **self._headers, **self._proxy_headers})

    def _origin(self, parts: SplitResult, port: int) -> Origin:
        host = self.key[1]
        tls = None
        if parts.scheme == "https":
            tls = httpx.create_ssl_context()  # httpx's trust store: certifi, SSL_CERT_FILE, SSL_CERT_DIR
            tls.set_alpn_protocols(["http/1.1"])
        proxy = environment_proxy(parts.scheme, host, port)
        if proxy is None:
            return Origin(host, port, tls)
        try:
            proxy_host, proxy_port, credentials = _proxy_parts(proxy)
        except ValueError as exc:
            return Origin(host, port, tls, unusable=str(exc))
        if tls is None:
            # A forward proxy: connect to it, and name the upstream in each request line.
            self._prefix = f"http://{self._host}"
            if credentials:
                self._proxy_headers["proxy-authorization"] = credentials
            return Origin(proxy_host, proxy_port, None)
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n"
        if credentials:
            head += f"proxy-authorization: {credentials}\r\n"
        return Origin(host, port, tls, Tunnel(proxy_host, proxy_port, (head + "\r\n").encode("latin-1")))


def environment_proxy(scheme: str, host: str, port: int) -> str | None:
    """The proxy URL httpx (trust_env) would send scheme://host:port through, or None."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or _bypassed(scheme, host, port, proxies.get("no", "")):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _bypassed(scheme: str, host: str, port: int, no_proxy: str) -> bool:
    """NO_PROXY as httpx reads it: `*` is everything; every other entry becomes an httpx URL
    pattern (`_as_pattern`), matched on scheme, host and, where the entry names one, port."""
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        if not entry:
            continue
        try:
            pattern = urlsplit(_as_pattern(entry))
            if _pattern_matches(pattern, scheme, host, port):
                return True
        except ValueError:  # a port that is no number: httpx would refuse it; it bypasses nothing
            continue
    return False


def _as_pattern(entry: str) -> str:
    """An IPv4/IPv6 address or `localhost`: that host; `name` or `name:port`: name and its
    subdomains (on that port); `.name`: its subdomains only; `scheme://host[:port]` as written."""
    if "://" in entry:
        return entry
    if _is_address(entry, ipaddress.IPv4Address) or entry == "localhost":
        return f"all://{entry}"
    if _is_address(entry, ipaddress.IPv6Address):
        return f"all://[{entry}]"
    return f"all://*{entry}"


def _pattern_matches(pattern: SplitResult, scheme: str, host: str, port: int) -> bool:
    # As httpx.URL: a scheme's default port is no port, in the pattern and in the URL alike (so
    # `http://name:80` matches every port of name, and `name:80` no URL without an explicit port).
    url_port = None if _DEFAULT_PORTS.get(scheme) == port else port
    pattern_port = None if _DEFAULT_PORTS.get(pattern.scheme) == pattern.port else pattern.port
    if pattern.scheme not in ("all", scheme) or (pattern_port is not None and pattern_port != url_port):
        return False
    wanted = pattern.hostname or "*"
    return wanted == "*" or _in_domain(host, wanted[1:] if wanted.startswith("*.") else wanted)


def _in_domain(host: str, name: str) -> bool:
    """`.x`: a subdomain of x; `*x`: x or a subdomain; `x`: x alone."""
    if name.startswith("."):
        return host.endswith(name)
    if name.startswith("*"):
        return host == name[1:] or host.endswith(f".{name[1:]}")
    return host == name


def _is_address(entry: str, kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    try:
        kind(entry.split("/")[0])
    except ValueError:
        return False
    return True


def _proxy_parts(proxy: str) -> tuple[str, int, str | None]:
    parts = urlsplit(proxy)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(
            f"proxy {parts.scheme}://{parts.hostname} from the environment is not supported: "
            "use an http:// proxy, or name the upstream in NO_PROXY"
        )
    credentials = None
    if parts.username is not None or parts.password is not None:
        credentials = _basic(parts.username, parts.password)
    return parts.hostname, parts.port or 80, credentials


def _basic(username: str | None, password: str | None) -> str:
    pair = f"{unquote(username or '')}:{unquote(password or '')}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")
