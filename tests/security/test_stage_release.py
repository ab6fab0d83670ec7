"""High 1, the invariant: whatever fails at whichever stage, every stage releases what it reserved
and the request is audited. A failure is injected in front of each stage of the real path (the
app's own stage list, a real sim behind it): before the call, after the first chunk, and as a
client that goes away after the first chunk. The gateway has 2 audit slots and the key one
concurrent request, so a single leak turns the next case into a hang (caught by a deadline) or a 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from common.processes import Announced
from gateway.app import create_app
from gateway.auth.stage import new_secret
from gateway.core.chunks import Chunk
from gateway.errors import InvalidRequest
from gateway.pipeline import Handler, RequestContext, compose
from gateway.settings import parse_settings
from gateway.surfaces.chat_completions import ChatCompletions
from testkit.procs import deployment, gateway_config

CASE_DEADLINE_S = 20.0
KINDS = ("gateway_error_before", "bug_before", "gateway_error_after_first", "bug_after_first", "client_gone")


class Injected(RuntimeError):
    """A bug somewhere in a stage."""


class Fault:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        self._maybe_fail("before")
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk
                self._maybe_fail("after_first")

    def _maybe_fail(self, when: str) -> None:
        if self.kind == f"gateway_error_{when}":
            raise InvalidRequest("injected", code="injected")
        if self.kind == f"bug_{when}":
            raise Injected("injected")


@contextlib.asynccontextmanager
async def served(tmp_path: Path, sim: Announced) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, str]]:
    admin_key = new_secret()
    raw = gateway_config(
        deployment("a", sim),
        store={"kind": "embedded", "path": str(tmp_path / "data")},
        auth={"admin_key": admin_key},
        audit={"queue_size": 2, "flush_interval_s": 0.01},
    )
    app = create_app(parse_settings(raw))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30) as http:
            http.headers["authorization"] = f"Bearer {admin_key}"
            created = await http.post("/admin/keys", json={"name": "t", "tenant": "acme", "max_concurrency": 1})
            created.raise_for_status()
            yield app, http, created.json()["secret"]


async def run_case(app: FastAPI, key: str, position: int, kind: str) -> str:
    stages = list(app.state.stages)
    stages.insert(position, Fault(kind))
    pipeline = compose(stages, app.state.call)
    body = orjson.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})

    async def read_body() -> bytes:
        return body

    ctx = RequestContext(
        request_id=f"case-{uuid.uuid4().hex[:12]}",
        completion_id="chatcmpl-x",
        surface=ChatCompletions(),
        headers={"authorization": f"Bearer {key}"},
        read_body=read_body,
    )
    chunks = pipeline(ctx)
    try:
        if kind == "client_gone":
            assert await anext(chunks) is not None
            return ctx.request_id
        with pytest.raises((InvalidRequest, Injected)) as failed:
            async for _ in chunks:
                pass
        # The injected failure itself, not a 429: no earlier case left a lease behind.
        assert getattr(failed.value, "code", "injected") == "injected", (position, kind, failed.value)
    finally:
        await chunks.aclose()
    return ctx.request_id


async def audited(http: httpx.AsyncClient, request_ids: set[str]) -> set[str]:
    """The ids of `request_ids` that have a request record, once every one does (or the deadline)."""
    found: set[str] = set()
    async with asyncio.timeout(CASE_DEADLINE_S):
        while found != request_ids:
            records = (await http.get("/admin/audit", params={"kind": "request", "limit": 10_000})).json()["data"]
            found = {r["request_id"] for r in records} & request_ids
            if found != request_ids:
                await asyncio.sleep(0.02)
    return found


async def test_high1_every_stage_releases_what_it_reserved(tmp_path: Path, sim_pair: list[Announced]) -> None:
    async with served(tmp_path, sim_pair[0]) as (app, http, key):
        baseline = {t for t in asyncio.all_tasks()}
        request_ids: set[str] = set()
        cases: list[tuple[int, str]] = [(p, k) for p in range(2, len(app.state.stages) + 1) for k in KINDS]
        for position, kind in cases:  # position 0 and 1 are outside the audit stage: nothing to audit
            async with asyncio.timeout(CASE_DEADLINE_S):  # a leaked audit slot hangs the next case here
                request_ids.add(await run_case(app, key, position, kind))
                await app.state.quota.drain()  # the settlement of the case's reservation
        assert await audited(http, request_ids) == request_ids  # no request went unaudited
        leftover = {t for t in asyncio.all_tasks() if t not in baseline and not t.done()}
        assert leftover <= {asyncio.current_task()}, leftover  # no heartbeat or producer outlives its request
        verdict = (await http.get("/admin/audit/verify")).json()
        assert verdict["ok"], verdict
        answered = await http.post(
            "/v1/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {key}"},
        )
        assert answered.status_code == 200, answered.text  # the key's one concurrency slot is free


@pytest.mark.parametrize("depth", [300, 1000])
async def test_high1_a_record_that_cannot_be_encoded_still_frees_its_slot(
    tmp_path: Path, sim_pair: list[Announced], depth: int
) -> None:
    """Bodies past the encoder's limit, handed straight to the stages (as if a parser let them by):
    the audit stage still writes a record and frees its slot."""
    async with served(tmp_path, sim_pair[0]) as (app, http, key):
        deep: Any = "x"
        for _ in range(depth):
            deep = [deep]
        ids = set()
        for _ in range(4):  # twice the audit queue
            ctx = RequestContext(
                request_id=f"deep-{uuid.uuid4().hex[:12]}",
                completion_id="chatcmpl-x",
                surface=ChatCompletions(),
                headers={"authorization": f"Bearer {key}"},
                read_body=None,
                body={"messages": deep},
            )
            stages = app.state.stages
            audit_only = compose(stages[:2], _refuse)
            async with asyncio.timeout(CASE_DEADLINE_S):
                with pytest.raises(InvalidRequest):
                    async for _ in audit_only(ctx):
                        pass
            ids.add(ctx.request_id)
        assert await audited(http, ids) == ids


async def _refuse(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
    raise InvalidRequest("refused")
    yield Chunk()  # pragma: no cover - makes this a generator
