"""Low: slow clients. A request head or body that never finishes no longer holds a connection
(and an audit slot) for good, and connections that have not sent a whole request head - so cannot
have been authenticated - are capped, while other tenants keep being answered (slowloris)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway
from tests.security.helpers import CHAT, chat

HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 1.0
MAX_PENDING = 8
DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def strict(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("slow")
    config = gateway_config(
        deployment("a", sim_pair[0]),
        server={
            "header_timeout_s": HEADER_TIMEOUT_S,
            "body_timeout_s": BODY_TIMEOUT_S,
            "max_unauthenticated_connections": MAX_PENDING,
        },
        audit={"queue_size": 4},
    )
    with running_gateway(path, config) as running:
        yield running


def _connect(gateway: Gateway) -> socket.socket:
    url = urlsplit(gateway.url)
    return socket.create_connection((url.hostname, url.port), timeout=DEADLINE_S)


def _closed_by_server(sock: socket.socket) -> bytes:
    """What the server sent before closing; raises TimeoutError if it keeps the connection open."""
    received = b""
    sock.settimeout(DEADLINE_S)
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not part:
            return received
        received += part


@pytest.mark.timing
def test_low_a_request_head_that_never_ends_is_cut(strict: Gateway) -> None:
    with contextlib.closing(_connect(strict)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        _closed_by_server(sock)  # was: held open forever


@pytest.mark.timing
def test_low_an_idle_connection_is_cut(strict: Gateway) -> None:
    with contextlib.closing(_connect(strict)) as sock:
        _closed_by_server(sock)


def test_low_a_body_that_never_ends_is_408(strict: Gateway) -> None:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {strict.key}\r\nContent-Length: 1000\r\n\r\n"
    )
    with contextlib.closing(_connect(strict)) as sock:
        sock.sendall(head.encode() + b'{"model": "sim-model", ')
        answer = _read_response(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"request_timeout"' in answer


def _read_response(sock: socket.socket) -> bytes:
    sock.settimeout(DEADLINE_S)
    received = b""
    while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
        part = sock.recv(65536)
        if not part:
            break
        received += part
    return received


def test_low_slowloris_keeps_other_tenants_answered(strict: Gateway) -> None:
    """Three times the cap of connections that never finish their head. A client of another
    tenant on a connection it already has is answered throughout; new connections are refused
    only until the header timeout has cut the attackers'."""
    _, other_tenant = strict.create_key(tenant="globex")
    url = f"{strict.url}/v1/chat/completions"
    attackers: list[socket.socket] = []
    with httpx.Client(headers=strict.headers(other_tenant), timeout=DEADLINE_S) as victim:
        assert victim.post(url, json=CHAT).status_code == 200  # its connection is open before the attack
        try:
            for _ in range(MAX_PENDING * 3):
                sock = _connect(strict)
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
                attackers.append(sock)
            assert [victim.post(url, json=CHAT).status_code for _ in range(3)] == [200] * 3  # during the attack
        finally:
            for sock in attackers:
                sock.close()
    assert chat(strict, key=other_tenant).status_code == 200  # and on a new connection after it


def test_low_connections_past_the_cap_are_refused_at_once(strict: Gateway) -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(MAX_PENDING):
            sock = _connect(strict)
            sock.sendall(b"GET /v1/models HTTP/1.1\r\n")
            held.append(sock)
        extra = _connect(strict)
        with contextlib.closing(extra):
            extra.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = _closed_by_server(extra)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 503"), answer[:200]
    finally:
        for sock in held:
            sock.close()
    assert chat(strict, CHAT).status_code == 200
