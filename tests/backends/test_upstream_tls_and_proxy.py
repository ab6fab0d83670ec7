"""The upstream client over TLS (a CA made here, trusted through SSL_CERT_FILE as httpx's trust store
was), and through an HTTP proxy from the environment: forward for http, a CONNECT tunnel for https."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.backends.base import BackendRequest
from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.errors import UpstreamConnectError
from tests.backends.upstream import FakeUpstream, chunk, direct, http_chunked, http_fixed, sse, unjoined


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        names = [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ssl.SSLContext]:
    """A CA's certificate file, and a server context whose certificate (for 127.0.0.1) it signed."""
    folder = tmp_path_factory.mktemp("pki")
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key, "test CA", ca_key, ca=True)
    server = _certificate("127.0.0.1", server_key, "test CA", ca_key, ca=False)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (folder / "server.key").write_bytes(key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    return folder / "ca.pem", context


async def answer_all(writer: asyncio.StreamWriter, n: int) -> None:
    """A stream, then a fixed-length body (what a non-streaming server sends), then anything."""
    writer.write(http_chunked(sse(chunk("a"), chunk("b"))) if n != 1 else http_fixed("200 OK", sse(chunk("c"))))
    await writer.drain()


async def collect(b: OpenAICompatBackend, stream: bool = True) -> list[str | None]:
    request = BackendRequest(body={"model": "m", "messages": [], "stream": stream})
    return [c.content for c in unjoined([c async for c in b.stream(request)])]


async def test_https_streams_answers_and_probes_with_a_ca_from_ssl_cert_file(
    pki: tuple[Path, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, server_tls = pki
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    async with FakeUpstream(answer_all, tls=server_tls) as upstream:
        b = direct(upstream.url)
        assert await collect(b) == ["a", "b"]
        assert await collect(b, stream=False) == ["c"]
        await b.probe()
        await b.aclose()
    assert upstream.connections == 1
    assert upstream.heads[2].startswith(b"GET /v1/models HTTP/1.1\r\n")


async def test_an_untrusted_certificate_is_a_connect_error(
    pki: tuple[Path, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    async with FakeUpstream(answer_all, tls=pki[1]) as upstream:
        b = direct(upstream.url)
        with pytest.raises(UpstreamConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await collect(b)
        with pytest.raises(UpstreamConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await b.probe()
        await b.aclose()
    assert upstream.bodies == []


class TinyProxy:
    """An HTTP proxy on 127.0.0.1 that only reaches 127.0.0.1: CONNECT tunnels and forwarded requests."""

    def __init__(self, refuse: bytes | None = None) -> None:
        self._refuse = refuse
        self.heads: list[bytes] = []  # the first request of each connection

    async def __aenter__(self) -> TinyProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            method, target, _ = head.split(b" ", 2)
            if self._refuse is not None:
                writer.write(self._refuse)
                return
            authority = target if method == b"CONNECT" else target.split(b"/")[2]
            host, _, port = authority.decode().rpartition(":")
            assert host == "127.0.0.1"  # nowhere else
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
            if method == b"CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream_writer.write(head)
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def test_an_http_upstream_is_reached_through_http_proxy_with_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with TinyProxy() as proxy, FakeUpstream(answer_all) as upstream:
        monkeypatch.setenv("HTTP_PROXY", f"http://agent:s%3Dcret@127.0.0.1:{proxy.port}")
        b = direct(upstream.url)
        assert await collect(b) == ["a", "b"]
        await b.probe()
        await b.aclose()
    assert len(proxy.heads) == 1  # one kept-alive connection to the proxy
    head = proxy.heads[0].decode()
    assert head.startswith(f"POST http://127.0.0.1:{upstream.port}/v1/chat/completions HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{upstream.port}\r\n" in head
    assert f"proxy-authorization: Basic {base64.b64encode(b'agent:s=cret').decode()}\r\n" in head
    assert upstream.heads[1].startswith(f"GET http://127.0.0.1:{upstream.port}/v1/models HTTP/1.1".encode())


async def test_an_https_upstream_is_reached_through_a_connect_tunnel(
    pki: tuple[Path, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, server_tls = pki
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    async with TinyProxy() as proxy, FakeUpstream(answer_all, tls=server_tls) as upstream:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
        b = direct(upstream.url)
        assert await collect(b) == ["a", "b"]
        assert await collect(b, stream=False) == ["c"]
        await b.probe()
        await b.aclose()
    assert [h.split(b"\r\n")[0] for h in proxy.heads] == [f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1".encode()]
    assert upstream.heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")  # inside the tunnel
    assert upstream.connections == 1


async def test_no_proxy_sends_an_upstream_around_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    async with TinyProxy() as proxy, FakeUpstream(answer_all) as upstream:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("NO_PROXY", "example.com,127.0.0.1")
        b = direct(upstream.url)
        assert await collect(b) == ["a", "b"]
        await b.aclose()
    assert proxy.heads == []


async def test_a_proxy_that_refuses_the_tunnel_is_a_connect_error(monkeypatch: pytest.MonkeyPatch) -> None:
    refusal = b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n"
    async with TinyProxy(refuse=refusal) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
        b = direct("https://127.0.0.1:9/v1")
        with pytest.raises(UpstreamConnectError, match="status 407"):
            await collect(b)
        await b.aclose()


async def test_a_proxy_scheme_the_client_cannot_speak_fails_each_request_as_a_connect_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    b = direct("https://upstream.test/v1")
    with pytest.raises(UpstreamConnectError, match=r"socks5://127\.0\.0\.1 from the environment is not supported"):
        await collect(b)
    with pytest.raises(UpstreamConnectError, match="not supported"):
        await b.probe()
    await b.aclose()
