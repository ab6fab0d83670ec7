"""A malformed stored record reaches a client as the typed store_record_corrupt error (500, the
record named, its content never quoted), not as a 500 "Internal error" with a traceback."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.auth.stage import new_secret
from gateway.errors import StoreCorrupt
from gateway.settings import parse_settings
from gateway.store.embedded import DB_FILE, EmbeddedStore
from gateway.store.session_record import SessionState

SECRET = "do-not-quote-me"
FAR = time.time() + 86_400
INSERT_SESSION = "INSERT INTO sessions (tenant, id, state, expires_at) VALUES ('acme', 's1', ?, ?)"


@contextlib.asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    admin_key = new_secret()
    raw = {
        # Nothing listens there: these requests fail on the stored record before any upstream call.
        "models": [
            {
                "name": "sim-model",
                "deployments": [{"name": "a", "api_base": "http://127.0.0.1:9/v1", "model": "sim-model"}],
            }
        ],
        "routing": {"health": {"interval_s": 30}},
        "store": {"kind": "embedded", "path": str(tmp_path / "data")},
        "auth": {"admin_key": admin_key},
    }
    app = create_app(parse_settings(raw))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30) as http:
            http.headers["authorization"] = f"Bearer {admin_key}"
            created = await http.post("/admin/keys", json={"name": "t", "tenant": "acme"})
            created.raise_for_status()
            yield http, created.json()["secret"]


def write_raw(tmp_path: Path, sql: str, *args: object) -> None:
    db = sqlite3.connect(tmp_path / "data" / DB_FILE)
    with db:
        db.execute(sql, args)
    db.close()


def assert_corrupt(reply: httpx.Response, what: str) -> None:
    assert reply.status_code == 500, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("api_error", "store_record_corrupt")
    assert what in error["message"]
    assert SECRET not in reply.text


BAD = orjson.dumps({"secret": SECRET})[:-1]  # not JSON: cut before its end


@pytest.mark.parametrize(
    ("sql", "args", "path", "what"),
    [
        ("INSERT INTO releases VALUES ('sim-model', 'v1', 1.0, ?)", (BAD,), "/admin/models/sim-model/releases", "v1"),
        ("INSERT INTO audit_records VALUES (1000000, ?)", (BAD,), "/admin/audit?after_seq=999999", "audit"),
        (
            "INSERT INTO approvals (tenant, id, status, requested_at, expires_at, forget_at, record)"
            " VALUES ('acme', 'ap1', 'pending', 1.0, ?, ?, ?)",
            (FAR, FAR, BAD),
            "/admin/approvals",
            "approval",
        ),
    ],
)
async def test_an_admin_read_of_a_malformed_record_answers_store_record_corrupt(
    tmp_path: Path, sql: str, args: tuple[Any, ...], path: str, what: str
) -> None:
    async with served(tmp_path) as (http, _):
        write_raw(tmp_path, sql, *args)
        assert_corrupt(await http.get(path), what)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_on_a_session_whose_stored_state_is_malformed_is_refused_before_any_output(
    tmp_path: Path, stream: bool
) -> None:
    async with served(tmp_path) as (http, chat_key):
        write_raw(
            tmp_path, "INSERT INTO sessions (tenant, id, state, expires_at) VALUES ('acme', 's1', ?, ?)", BAD, FAR
        )
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        headers = {"authorization": f"Bearer {chat_key}", "x-session-id": "s1"}
        assert_corrupt(await http.post("/v1/chat/completions", json=body, headers=headers), "session")


async def test_resuming_a_streaming_session_whose_state_lacks_what_a_takeover_needs_is_refused_up_front(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (http, chat_key):
        state = orjson.dumps({"status": "streaming", "shared": True, "model": "sim-model"})
        write_raw(tmp_path, INSERT_SESSION, state, FAR)
        reply = await http.get("/v1/sessions/s1/stream", headers={"authorization": f"Bearer {chat_key}"})
        assert_corrupt(reply, "session")


async def test_a_resumed_stream_whose_state_turns_malformed_mid_stream_ends_with_an_in_band_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    state = {"status": "streaming", "shared": True, "model": "sim-model", "completion_id": "c1", "created": 1}
    loads = 0
    real_load = EmbeddedStore.session_load

    async def load_then_corrupt(self: EmbeddedStore, tenant: str, session_id: str) -> SessionState | None:
        nonlocal loads
        loads += 1
        if loads > 1:  # the reload when this replica takes the session over
            raise StoreCorrupt("session state", session_id, "changed under the reader")
        return await real_load(self, tenant, session_id)

    async with served(tmp_path) as (http, chat_key):
        write_raw(tmp_path, INSERT_SESSION, orjson.dumps({**state, "body": body}), FAR)
        monkeypatch.setattr(EmbeddedStore, "session_load", load_then_corrupt)
        reply = await http.get("/v1/sessions/s1/stream", headers={"authorization": f"Bearer {chat_key}"})
        assert reply.status_code == 200
        assert '"code":"store_record_corrupt"' in reply.text
        assert reply.text.rstrip().endswith("data: [DONE]")


async def test_a_key_whose_stored_record_is_malformed_is_answered_store_record_corrupt(tmp_path: Path) -> None:
    async with served(tmp_path) as (http, chat_key):
        write_raw(tmp_path, "UPDATE api_keys SET record = ? WHERE tenant = 'acme'", BAD)
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        chat = await http.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {chat_key}"})
        assert_corrupt(chat, "API key")
        assert_corrupt(await http.get("/admin/keys"), "API key")
