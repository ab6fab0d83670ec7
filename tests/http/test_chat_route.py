"""POST /v1/chat/completions is answered before the router, with the same answers and errors."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import httpx
import pytest

from gateway.backends.base import BackendRequest
from gateway.core.chunks import Chunk
from tests.doubles import Script, ScriptedBackend
from tests.telemetry_app import CHAT_BODY, traced_gateway


class Buggy:
    """A backend with a bug: not an upstream failure, not a GatewayError."""

    name = "a"

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        raise ZeroDivisionError("a bug")
        yield Chunk()  # pragma: no cover - makes this an async generator

    async def probe(self) -> None:
        return None

    def cut_idle(self, idle_s: float) -> int:
        return 0

    async def aclose(self) -> None:
        return None


async def test_an_answer_and_a_refusal_come_back_as_before(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script()), tracing=False) as gateway:
        answered = await gateway.chat()
        refused = await gateway.chat(key="not-a-key")
        unknown_model = await gateway.chat(model="nope")
    assert answered.status_code == 200, answered.text
    assert answered.json()["object"] == "chat.completion"
    assert answered.headers["x-request-id"]
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert unknown_model.status_code == 404
    assert unknown_model.json()["error"]["param"] == "model"


async def test_other_methods_of_the_path_still_get_the_routers_405(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script()), tracing=False) as gateway:
        reply = await gateway.http.get("/v1/chat/completions", headers=gateway.auth())
    assert reply.status_code == 405
    assert reply.json()["error"]["code"] == "method_not_allowed"


async def test_the_route_is_found_under_the_root_path_the_app_is_mounted_at(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script()), tracing=False) as gateway:
        transport = gateway.http._transport
        assert isinstance(transport, httpx.ASGITransport)
        mounted = httpx.ASGITransport(app=transport.app, root_path="/gw")
        async with httpx.AsyncClient(transport=mounted, base_url="http://gateway") as http:
            reply = await http.post("/gw/v1/chat/completions", json=CHAT_BODY, headers=gateway.auth())
    assert reply.status_code == 200, reply.text


async def test_a_bug_is_an_openai_shaped_500_from_the_server_error_handler(tmp_path: Path) -> None:
    async with traced_gateway(tmp_path, Buggy(), tracing=False) as gateway:
        transport = gateway.http._transport
        assert isinstance(transport, httpx.ASGITransport)
        quiet = httpx.ASGITransport(app=transport.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=quiet, base_url="http://gateway") as http:
            reply = await http.post("/v1/chat/completions", json=CHAT_BODY, headers=gateway.auth())
    assert reply.status_code == 500
    assert reply.json()["error"] == {
        "message": "Internal error in the gateway",
        "type": "api_error",
        "param": None,
        "code": "internal_error",
    }


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/chat/completion"])
async def test_near_miss_paths_are_the_routers_to_answer(tmp_path: Path, path: str) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script()), tracing=False) as gateway:
        reply = await gateway.http.post(path, json=CHAT_BODY, headers=gateway.auth())
    assert reply.status_code in (307, 404), reply.text
