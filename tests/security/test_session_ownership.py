"""Issue 11, Medium: sessions belonged to a tenant, not a key. Any key of a tenant could read, replay,
append to or delete another key's session and its transcript (which holds approval tokens meant
only for the requester). Owner = the key that created the session; a session is shared with the
rest of its tenant only when created with `X-Session-Share: tenant`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway, start_sim

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "my secret plan"}], "max_tokens": 5}


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("session-ownership")
    with running_gateway(path, gateway_config(deployment("a", sim_pair[0]))) as running:
        yield running


def chat(gateway: Gateway, key: str, session_id: str, *, stream: bool, **headers: str) -> httpx.Response:
    all_headers = {**gateway.headers(key), "X-Session-Id": session_id, **headers}
    body = {**BODY, "stream": stream}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=all_headers, timeout=20)


def saved(gateway: Gateway, key: str, session_id: str) -> dict[str, object]:
    """The transcript, once the (background) save has landed: bounded wait."""
    deadline = time.monotonic() + 10
    while True:
        reply = httpx.get(f"{gateway.url}/v1/sessions/{session_id}", headers=gateway.headers(key), timeout=10)
        if reply.status_code == 200 and reply.json()["status"] == "done":
            return dict(reply.json())
        assert time.monotonic() < deadline, reply.text
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_another_key_of_the_tenant_cannot_touch_a_session(gateway: Gateway, stream: bool) -> None:
    session_id = f"s-{uuid.uuid4().hex[:10]}"
    _, other = gateway.create_key(tenant="acme")
    assert chat(gateway, gateway.key, session_id, stream=stream).status_code == 200
    saved(gateway, gateway.key, session_id)
    base = f"{gateway.url}/v1/sessions/{session_id}"
    attempts = {
        "read": httpx.get(base, headers=gateway.headers(other), timeout=10),
        "replay": httpx.get(f"{base}/stream", headers=gateway.headers(other), timeout=10),
        "append": chat(gateway, other, session_id, stream=stream, **{"X-Session-Append": "true"}),
        "overwrite": chat(gateway, other, session_id, stream=stream),
        "delete": httpx.delete(base, headers=gateway.headers(other), timeout=10),
    }
    for what, reply in attempts.items():
        assert reply.status_code == 404, (what, reply.text)
        assert reply.json()["error"]["type"] == "not_found_error", what
    transcript = saved(gateway, gateway.key, session_id)
    assert transcript["messages"][0]["content"] == "my secret plan"  # type: ignore[index]


def test_a_session_shared_with_the_tenant_is_open_to_its_keys_only(gateway: Gateway) -> None:
    session_id = f"s-{uuid.uuid4().hex[:10]}"
    _, colleague = gateway.create_key(tenant="acme")
    _, outsider = gateway.create_key(tenant="globex")
    created = chat(gateway, gateway.key, session_id, stream=False, **{"X-Session-Share": "tenant"})
    assert created.status_code == 200, created.text
    saved(gateway, gateway.key, session_id)
    assert saved(gateway, colleague, session_id)["id"] == session_id
    appended = chat(gateway, colleague, session_id, stream=False, **{"X-Session-Append": "true"})
    assert appended.status_code == 200
    outside = httpx.get(f"{gateway.url}/v1/sessions/{session_id}", headers=gateway.headers(outsider), timeout=10)
    assert outside.status_code == 404


def test_bad_share_value_is_400(gateway: Gateway) -> None:
    reply = chat(gateway, gateway.key, f"s-{uuid.uuid4().hex[:10]}", stream=False, **{"X-Session-Share": "world"})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "X-Session-Share"


def test_a_live_stream_cannot_be_taken_over_by_another_key(tmp_path: Path) -> None:
    """While the owner's stream is still being generated (only its first checkpoint - the state - is
    in the store), a second key naming the same id must neither replace nor resume it."""
    sim = start_sim("--tpot-ms", "20")
    try:
        sessions = {"checkpoint_every_events": 100_000, "checkpoint_interval_s": 600}
        with running_gateway(tmp_path, gateway_config(deployment("a", sim), sessions=sessions)) as gateway:
            session_id = f"s-{uuid.uuid4().hex[:10]}"
            _, other = gateway.create_key(tenant="acme")
            headers = {**gateway.headers(), "X-Session-Id": session_id}
            body = {**BODY, "stream": True, "max_tokens": 400}
            url = f"{gateway.url}/v1/chat/completions"
            with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as owner:
                assert owner.status_code == 200
                next(owner.iter_lines())  # the stream is live on the replica
                taken = chat(gateway, other, session_id, stream=True)
                assert taken.status_code == 404, taken.text
                resumed = httpx.get(f"{gateway.url}/v1/sessions/{session_id}/stream", headers=gateway.headers(other))
                assert resumed.status_code == 404
    finally:
        sim.stop()
