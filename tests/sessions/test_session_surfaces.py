"""A session remembers the API surface its client speaks (gateway/core/surface.py): a replica
resumes it in that surface's form, and one that does not serve that surface says so."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.http.test_store_corrupt import FAR, INSERT_SESSION, served, write_raw

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
STATE = {"status": "streaming", "shared": True, "model": "sim-model", "completion_id": "c1", "created": 1, "body": BODY}


async def test_a_session_of_a_surface_this_replica_does_not_serve_is_not_resumable_and_says_which(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (http, chat_key):
        write_raw(tmp_path, INSERT_SESSION, orjson.dumps({**STATE, "surface": "some.later.api"}), FAR)
        reply = await http.get("/v1/sessions/s1/stream", headers={"authorization": f"Bearer {chat_key}"})
    assert reply.status_code == 409, reply.text
    error = reply.json()["error"]
    assert error["code"] == "session_not_resumable"
    assert "'some.later.api' API" in error["message"]
