"""The official openai SDK against a gateway process: only base_url changes."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import AsyncOpenAI, NotFoundError
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)

from common.processes import Announced
from testkit.procs import Gateway

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about circuit breakers"}]
WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


def client(gateway: Gateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0, timeout=10)


def direct_text(sim: Announced, max_tokens: int) -> str:
    body = {"model": "sim-model", "messages": MESSAGES, "max_tokens": max_tokens}
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10).json()
    return str(reply["choices"][0]["message"]["content"])


async def test_plain_completion_matches_the_backend(shared_gateway: Gateway, sims: list[Announced]) -> None:
    async with client(shared_gateway) as sdk:
        reply = await sdk.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=12)
    assert reply.choices[0].message.content == direct_text(sims[0], 12)
    assert reply.choices[0].finish_reason == "length"
    assert reply.model == "sim-model"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12


async def test_streaming_yields_the_same_text_and_usage(shared_gateway: Gateway, sims: list[Announced]) -> None:
    async with client(shared_gateway) as sdk:
        stream = await sdk.chat.completions.create(
            model="sim-model",
            messages=MESSAGES,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == direct_text(sims[0], 12)
    assert len({c.id for c in chunks}) == 1, "one completion id across the stream"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].choices == []


async def test_streaming_without_include_usage_sends_no_usage_chunk(shared_gateway: Gateway) -> None:
    async with client(shared_gateway) as sdk:
        stream = await sdk.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=4, stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_tool_call_arrives_whole_with_valid_json_arguments(shared_gateway: Gateway) -> None:
    async with client(shared_gateway) as sdk:
        reply = await sdk.chat.completions.create(
            model="sim-model", messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="auto"
        )
        stream = await sdk.chat.completions.create(
            model="sim-model", messages=MESSAGES, tools=[WEATHER_TOOL], stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert reply.choices[0].message.tool_calls
    call = reply.choices[0].message.tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city", "days"}
    streamed = "".join(
        (t.function.arguments if t.function else None) or ""
        for c in chunks
        if c.choices
        for t in (c.choices[0].delta.tool_calls or [])
    )
    assert streamed == call.function.arguments


async def test_models_lists_the_logical_models(shared_gateway: Gateway) -> None:
    async with client(shared_gateway) as sdk:
        models = await sdk.models.list()
    assert [m.id for m in models.data] == ["sim-model"]


async def test_unknown_model_is_a_404_the_sdk_understands(shared_gateway: Gateway) -> None:
    async with client(shared_gateway) as sdk:
        with pytest.raises(NotFoundError) as raised:
            await sdk.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert raised.value.code == "model_not_found"
