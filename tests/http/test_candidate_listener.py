"""The one-time listener a preflight serves the candidate's request path on: its token only,
and closed however the preflight ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from gateway.http.candidate_listener import serve_once
from gateway.releases.candidate import Listener


def recording_app(seen: list[dict[bytes, bytes]]) -> object:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"behind the door"})

    return app


def refused(listener: Listener) -> bool:
    try:
        httpx.get(f"{listener.base_url}/models", timeout=5)
    except httpx.ConnectError:
        return True
    return False


async def get(listener: Listener, authorization: str | None) -> httpx.Response:
    headers = {"authorization": authorization} if authorization is not None else {}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(f"{listener.base_url}/models", headers=headers)


def test_only_the_one_time_token_gets_through_and_the_app_never_sees_it() -> None:
    async def scenario(seen: list[dict[bytes, bytes]]) -> Listener:
        async with serve_once(recording_app(seen)) as listener:  # type: ignore[arg-type]
            assert listener.base_url.startswith("http://127.0.0.1:")
            for wrong in (None, "Bearer wrong", f"Bearer {listener.token}x", listener.token, f"Basic {listener.token}"):
                reply = await get(listener, wrong)
                assert reply.status_code == 401, wrong
                assert reply.json()["error"]["code"] == "invalid_api_key"
            assert seen == [], "a refused request reached the request path"
            right = await get(listener, f"Bearer {listener.token}")
            assert right.status_code == 200
            assert right.text == "behind the door"
            return listener

    seen: list[dict[bytes, bytes]] = []
    first = asyncio.run(scenario(seen))
    assert len(seen) == 1
    assert b"authorization" not in seen[0], "the token is for the door only"
    second = asyncio.run(scenario([]))
    assert second.token != first.token, "a token is good for one preflight"


def test_the_listener_is_closed_when_the_preflight_ends() -> None:
    async def scenario() -> Listener:
        async with serve_once(recording_app([])) as listener:  # type: ignore[arg-type]
            assert (await get(listener, None)).status_code == 401  # open while the block runs
        return listener

    assert refused(asyncio.run(scenario()))


def test_the_listener_is_closed_when_the_preflight_is_cancelled_or_fails() -> None:
    opened: list[Listener] = []

    async def cancelled() -> None:
        entered = asyncio.Event()

        async def preflight() -> None:
            async with serve_once(recording_app([])) as listener:  # type: ignore[arg-type]
                opened.append(listener)
                entered.set()
                await asyncio.Event().wait()  # a smoke run that never ends

        task = asyncio.create_task(preflight())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def failing() -> None:
        async with serve_once(recording_app([])) as listener:  # type: ignore[arg-type]
            opened.append(listener)
            raise RuntimeError("the smoke run broke")

    asyncio.run(cancelled())
    with pytest.raises(RuntimeError, match="the smoke run broke"):
        asyncio.run(failing())
    assert len(opened) == 2
    assert all(refused(listener) for listener in opened)


def test_the_listeners_token_does_not_appear_in_its_repr() -> None:
    """A listener logged or shown in a traceback must not hand out the door's key."""
    listener = Listener("http://127.0.0.1:1/v1", "secret-token-value")
    assert "secret-token-value" not in repr(listener)
    assert "http://127.0.0.1:1/v1" in repr(listener)


def test_request_heads_that_never_arrive_are_cut_and_capped_while_the_token_still_gets_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anyone on the machine can connect to the listener: half-open heads must not pile up."""
    from gateway.http import candidate_listener

    monkeypatch.setattr(candidate_listener, "_HEADER_TIMEOUT_S", 0.5)

    async def scenario() -> tuple[list[bytes], int]:
        async with serve_once(recording_app([])) as listener:  # type: ignore[arg-type]
            port = int(listener.base_url.split(":")[2].split("/")[0])
            silent = [
                await asyncio.open_connection("127.0.0.1", port) for _ in range(candidate_listener._MAX_PENDING + 4)
            ]
            async with asyncio.timeout(5):  # well past the head timeout: every one was cut by then
                ends = [await reader.read() for reader, _ in silent]
            for _, writer in silent:
                writer.close()
            return ends, (await get(listener, f"Bearer {listener.token}")).status_code

    ends, status = asyncio.run(scenario())
    assert sum(end.startswith(b"HTTP/1.1 503") for end in ends) >= 4, "connections over the cap were not refused"
    assert status == 200


def test_a_cancellation_arriving_while_the_listener_is_abandoned_is_not_swallowed() -> None:
    """The server task's own CancelledError is expected; the preflight's must go through."""
    from gateway.http.candidate_listener import _abandon

    async def scenario() -> bool:
        stopping = asyncio.Event()

        async def slow_to_stop() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                stopping.set()
                await asyncio.sleep(0.2)  # a server shutdown that takes a moment
                raise

        server = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        preflight = asyncio.create_task(_abandon(server))
        await stopping.wait()
        preflight.cancel()  # the preflight is cancelled while it abandons the listener
        with contextlib.suppress(asyncio.CancelledError):
            await preflight
        return preflight.cancelled()

    assert asyncio.run(scenario()), "the preflight's cancellation was swallowed"


def test_a_request_cut_off_when_the_listener_closes_is_not_logged_as_an_application_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The smoke run timed out: its requests still running are cancelled, which is expected."""

    async def scenario() -> None:
        entered = asyncio.Event()

        async def hanging(scope: Scope, receive: Receive, send: Send) -> None:
            entered.set()
            await asyncio.Event().wait()

        async with serve_once(hanging) as listener:
            client = asyncio.create_task(get(listener, f"Bearer {listener.token}"))
            await entered.wait()
        client.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await client

    caplog.set_level(logging.INFO)
    asyncio.run(scenario())
    tracebacks = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
    assert "cancelled" in caplog.text
