"""The Anthropic Messages API through the official `anthropic` SDK: only the base URL and key change
(issue 32). The backend is the simulated one, spoken to in chat completions."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic import (
    AsyncAnthropic,
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
)
from anthropic.types import ToolParam

from common.processes import Announced
from testkit.procs import Gateway, audit_records, deployment, gateway_config, running_gateway
from tests.e2e.test_tool_policy import approve_when_pending

QUESTION = "Tell me about circuit breakers"
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}


def client(gateway: Gateway, key: str | None = None) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=gateway.url, api_key=key or gateway.key, max_retries=0, timeout=20)


def text_of(message: Any) -> str:
    """The text blocks of a message, joined."""
    return "".join(block.text for block in message.content if block.type == "text")


def backend_text(sim: Announced, max_tokens: int, system: str | None = None) -> str:
    messages = [{"role": "user", "content": QUESTION}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    body = {"model": "sim-model", "messages": messages, "max_tokens": max_tokens}
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10).json()
    return str(reply["choices"][0]["message"]["content"])


async def test_a_message_carries_the_backends_answer(gateway: Gateway, echo_sim: Announced) -> None:
    async with client(gateway) as sdk:
        message = await sdk.messages.create(
            model="sim-model", max_tokens=12, system="Be brief.", messages=[{"role": "user", "content": QUESTION}]
        )
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert text_of(message) == backend_text(echo_sim, 12, "Be brief.")
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 12
    assert message.usage.input_tokens > 0


async def test_the_sdks_stream_accumulates_exactly_the_final_message(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        async with sdk.messages.stream(
            model="sim-model", max_tokens=40, messages=[{"role": "user", "content": QUESTION}]
        ) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
        collected = await sdk.messages.create(
            model="sim-model", max_tokens=40, messages=[{"role": "user", "content": QUESTION}]
        )
    assert text == text_of(final)
    assert final.model_dump(exclude={"id"}) == collected.model_dump(exclude={"id"})
    assert final.stop_reason == "max_tokens"  # the sim always writes max_tokens tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_use_and_its_result_make_a_two_turn_exchange(gateway: Gateway, stream: bool) -> None:
    question: Any = [{"role": "user", "content": "What is the weather?"}]
    first: Any
    async with client(gateway) as sdk:
        if stream:
            async with sdk.messages.stream(
                model="sim-model",
                max_tokens=100,
                messages=question,
                tools=[WEATHER],
            ) as events:
                first = await events.get_final_message()
        else:
            first = await sdk.messages.create(model="sim-model", max_tokens=100, messages=question, tools=[WEATHER])
        (use,) = [block for block in first.content if block.type == "tool_use"]
        assert first.stop_reason == "tool_use"
        assert set(use.input) == {"city", "days"}
        result: Any = [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "rain"}]}]
        second = await sdk.messages.create(
            model="sim-model",
            max_tokens=100,
            tools=[WEATHER],
            messages=[*question, {"role": "assistant", "content": first.content}, {"role": "user", "content": result}],
        )
    assert text_of(second) == "The tool said: rain"
    assert second.stop_reason == "end_turn"


async def test_a_tool_outside_the_whitelist_never_reaches_the_model(gateway: Gateway) -> None:
    delete: Any = {**WEATHER, "name": "delete_everything"}
    async with client(gateway) as sdk:
        raw = await sdk.messages.with_raw_response.create(
            model="sim-model", max_tokens=20, messages=[{"role": "user", "content": QUESTION}], tools=[delete]
        )
    message = await raw.parse()
    assert [block.type for block in message.content] == ["text"]  # the sim calls any tool it is offered
    assert raw.headers["x-tools-removed"] == "delete_everything"


async def test_a_risky_tool_use_waits_for_a_person_and_then_reaches_the_agent(gateway: Gateway) -> None:
    refund: ToolParam = {
        "name": "refund_payment",
        "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    }
    _, approver = gateway.create_key(scopes=["approver"])
    decided: list[Any] = []
    human = threading.Thread(target=approve_when_pending, args=(gateway, approver, "refund_payment", decided))
    human.start()
    async with client(gateway) as sdk:
        message = await sdk.messages.create(
            model="sim-model", max_tokens=100, messages=[{"role": "user", "content": "Refund it."}], tools=[refund]
        )
    await asyncio.to_thread(human.join, 30)
    assert decided[0]["status"] == "approved"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "refund_payment"


async def test_count_tokens_counts_the_prompt_as_the_quota_does(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        short = await sdk.messages.count_tokens(model="sim-model", messages=[{"role": "user", "content": "Hi"}])
        longer = await sdk.messages.count_tokens(
            model="sim-model",
            system="Be brief.",
            messages=[{"role": "user", "content": QUESTION * 10}],
            tools=[WEATHER],
        )
    assert 0 < short.input_tokens < longer.input_tokens


async def test_the_key_may_come_as_a_bearer_token_too(gateway: Gateway) -> None:
    async with AsyncAnthropic(base_url=gateway.url, auth_token=gateway.key, max_retries=0, timeout=20) as sdk:
        message = await sdk.messages.create(
            model="sim-model", max_tokens=3, messages=[{"role": "user", "content": "Hi"}]
        )
    assert message.usage.output_tokens == 3


async def test_each_error_comes_in_anthropics_shape_and_type(gateway: Gateway) -> None:
    hello: Any = [{"role": "user", "content": "Hi"}]
    _, approver = gateway.create_key(scopes=["approver"])
    _, throttled = gateway.create_key(rpm=1)
    async with client(gateway, "agw_" + "x" * 40) as stranger:
        with pytest.raises(AuthenticationError) as bad_key:
            await stranger.messages.create(model="sim-model", max_tokens=3, messages=hello)
    async with client(gateway, approver) as wrong_scope:
        with pytest.raises(PermissionDeniedError):
            await wrong_scope.messages.create(model="sim-model", max_tokens=3, messages=hello)
    async with client(gateway) as sdk:
        with pytest.raises(NotFoundError) as unknown:
            await sdk.messages.create(model="no-such-model", max_tokens=3, messages=hello)
        with pytest.raises(BadRequestError) as bad:
            await sdk.messages.create(model="sim-model", max_tokens=0, messages=hello)
    async with client(gateway, throttled) as limited:
        await limited.messages.create(model="sim-model", max_tokens=3, messages=hello)
        with pytest.raises(RateLimitError) as limited_error:
            await limited.messages.create(model="sim-model", max_tokens=3, messages=hello)
    bodies: list[Any] = [bad_key.value.body, unknown.value.body, bad.value.body]
    assert [body["type"] for body in bodies] == ["error"] * 3
    assert [body["error"]["type"] for body in bodies] == [
        "authentication_error",
        "not_found_error",
        "invalid_request_error",
    ]
    assert limited_error.value.response.headers.get("retry-after")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": "sim-model", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "sim-model", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
        (
            {"model": "sim-model", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "type",
        ),
        (
            {
                "model": "sim-model",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "bash_20250124", "name": "bash"}],
            },
            "type",
        ),
        ({"model": "sim-model", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "bogus": 1}, "bogus"),
    ],
)
async def test_a_bad_body_is_an_anthropic_400(gateway: Gateway, body: dict[str, Any], param: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": gateway.key})
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert param in error["error"]["message"]


async def test_every_message_is_audited_under_its_surface(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        raw = await sdk.messages.with_raw_response.create(
            model="sim-model", max_tokens=3, messages=[{"role": "user", "content": QUESTION}]
        )
    request_id = raw.headers["x-request-id"]
    records = audit_records(gateway, "request", lambda rs: any(r.get("request_id") == request_id for r in rs))
    (record,) = [r for r in records if r.get("request_id") == request_id]
    assert record["surface"] == "messages"
    assert record["completion_tokens"] == 3


def test_no_deployment_to_answer_is_anthropics_529_overloaded(tmp_path: Path, echo_sim: Announced) -> None:
    with socket.socket() as probe:  # a port nothing listens on: every attempt is refused
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    config = gateway_config(deployment("down", echo_sim, api_base=dead))
    with running_gateway(tmp_path, config) as down:
        reply = httpx.post(
            f"{down.url}/v1/messages",
            json={"model": "sim-model", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]},
            headers={"x-api-key": down.key, "anthropic-version": "2023-06-01"},
            timeout=30,
        )
    assert reply.status_code == 529, reply.text
    assert reply.json()["error"]["type"] == "overloaded_error"
