"""Medium: long synchronous work off the event loop. While one tenant's very large body is being
decoded and validated, or a promote hashes a checkpoint, another tenant's small request is
answered (it used to wait: one 10 MB body stalled every request for seconds, a rollback for
seconds per GiB of weights)."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from checkpoints.registry import CheckpointRegistry
from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway
from tests.security.helpers import chat

MESSAGES = 150_000  # ~19 MB: about a second of parsing on this machine, many on a loaded one
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def roomy(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("roomy")
    config = gateway_config(deployment("a", sim_pair[0]), server={"max_body_bytes": 64 * 1024 * 1024})
    with running_gateway(path, config) as running:
        yield running


def test_medium_big_body_is_parsed_off_the_event_loop(roomy: Gateway) -> None:
    _, other_tenant = roomy.create_key(tenant="globex")
    messages = [{"role": "user", "content": "hello world " * 8}] * MESSAGES
    # The last message is invalid, so the big request ends as soon as its parse does (a 400).
    body = orjson.dumps({"model": "sim-model", "messages": [*messages, {"role": "wizard"}]})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {roomy.key}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    url = urlsplit(roomy.url)
    with contextlib.closing(socket.create_connection((url.hostname, url.port), timeout=DEADLINE_S)) as big:
        big.sendall(head.encode() + body)
        answered_meanwhile = 0
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            reply = chat(roomy, key=other_tenant, timeout=DEADLINE_S)
            assert reply.status_code == 200
            if select.select([big], [], [], 0)[0]:
                break  # the big request has its answer: whatever came after does not count
            answered_meanwhile += 1
        assert answered_meanwhile >= 1  # another tenant was served while the big body was parsed
        answer = _read_all(big)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert f"messages[{MESSAGES}].role".encode() in answer


def _read_all(sock: socket.socket) -> bytes:
    received = b""
    while part := sock.recv(65536):
        received += part
    return received


def test_medium_checkpoint_hashing_does_not_pause_traffic(sim_pair: list[Announced], tmp_path: Path) -> None:
    """A promote hashes the release's checkpoint (seconds per GiB); meanwhile another tenant's
    requests are answered. The weights were changed after registration, so the promote ends with
    a 409 as soon as the hashing does."""
    registry_root = tmp_path / "registry"
    weights_dir = tmp_path / "ckpt"
    weights_dir.mkdir()
    weights = weights_dir / "model.safetensors"
    with weights.open("wb") as sparse:
        sparse.truncate(256 * 1024 * 1024)
    CheckpointRegistry(registry_root).register(weights_dir, "ft", 100)
    with weights.open("r+b") as changed:
        changed.seek(-1, 2)
        changed.write(b"\x01")
    config = gateway_config(deployment("a", sim_pair[0]), releases={"checkpoint_registry": str(registry_root)})
    with running_gateway(tmp_path, config) as gateway:
        _, other_tenant = gateway.create_key(tenant="globex")
        admin = gateway.headers(gateway.admin_key)
        spec = {"version": "v1", "deployments": ["a"], "checkpoint": "ft@100"}
        created = httpx.post(f"{gateway.url}/admin/models/sim-model/releases", json=spec, headers=admin, timeout=30)
        assert created.status_code == 201, created.text
        with ThreadPoolExecutor(1) as pool:
            promote = pool.submit(
                httpx.post,
                f"{gateway.url}/admin/models/sim-model/promote",
                json={"version": "v1"},
                headers=admin,
                timeout=DEADLINE_S,
            )
            answered_meanwhile = 0
            deadline = time.monotonic() + DEADLINE_S
            while not promote.done() and time.monotonic() < deadline:
                assert chat(gateway, key=other_tenant, timeout=DEADLINE_S).status_code == 200
                answered_meanwhile += not promote.done()
            refused = promote.result()
    assert refused.status_code == 409, refused.text
    assert "changed: model.safetensors" in refused.json()["error"]["message"]
    assert answered_meanwhile >= 1
