"""The Responses API through the official `openai` SDK: only the base URL changes (issue 31)."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError
from openai.types.responses import FunctionToolParam, Response, ResponseFunctionToolCall, ResponseInputItemParam

from common.processes import Announced
from testkit.procs import Gateway, audit_records

QUESTION = "Tell me about circuit breakers"
WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
    "strict": True,
}


def client(gateway: Gateway, key: str | None = None) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key or gateway.key, max_retries=0, timeout=10)


def backend_text(sim: Announced, max_tokens: int) -> str:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": max_tokens}
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10).json()
    return str(reply["choices"][0]["message"]["content"])


async def test_a_response_carries_the_backends_answer_as_one_message(gateway: Gateway, echo_sim: Announced) -> None:
    async with client(gateway) as sdk:
        response = await sdk.responses.create(model="sim-model", input=QUESTION, max_output_tokens=12)
    assert response.id.startswith("resp_")
    assert response.output_text == backend_text(echo_sim, 12)
    assert [item.type for item in response.output] == ["message"]
    assert response.status == "incomplete"  # the 12 tokens ran out: the sim stopped for length
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == 12
    assert response.usage.total_tokens == response.usage.input_tokens + 12


async def test_the_sdks_stream_helper_rebuilds_exactly_the_final_response(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        async with sdk.responses.stream(model="sim-model", input=QUESTION) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
        collected = await sdk.responses.create(model="sim-model", input=QUESTION)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    opening = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[:4] == opening
    closing = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-4:] == [*closing, "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == deltas == collected.output_text
    assert final.status == "completed"
    assert final.usage is not None
    assert collected.usage is not None
    assert final.usage.output_tokens == collected.usage.output_tokens
    assert final.id == events[0].response.id  # type: ignore[union-attr]


async def test_a_stream_cut_by_max_output_tokens_ends_incomplete(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        stream = await sdk.responses.create(model="sim-model", input=QUESTION, max_output_tokens=5, stream=True)
        events = [event async for event in stream]
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.usage is not None
    assert last.response.usage.output_tokens == 5
    assert last.response.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def test_a_tool_outside_the_whitelist_never_reaches_the_model(gateway: Gateway) -> None:
    delete: FunctionToolParam = {**WEATHER, "name": "delete_everything"}
    async with client(gateway) as sdk:
        response = await sdk.responses.create(model="sim-model", input=QUESTION, tools=[delete])
    assert [item.type for item in response.output] == ["message"]  # the sim calls any tool it is offered


@pytest.mark.parametrize("stream", [False, True])
async def test_a_function_call_and_its_output_make_a_two_turn_exchange(gateway: Gateway, stream: bool) -> None:
    async with client(gateway) as sdk:
        first: Response
        if stream:
            async with sdk.responses.stream(model="sim-model", input=QUESTION, tools=[WEATHER]) as events:
                first = await events.get_final_response()
        else:
            first = await sdk.responses.create(model="sim-model", input=QUESTION, tools=[WEATHER])
        (call,) = first.output
        assert isinstance(call, ResponseFunctionToolCall)
        assert call.name == "get_weather"
        assert set(json.loads(call.arguments)) == {"city", "days"}
        assert first.status == "completed"
        turns: list[ResponseInputItemParam] = [
            {"role": "user", "content": QUESTION},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ]
        second = await sdk.responses.create(model="sim-model", tools=[WEATHER], input=turns)
    assert second.output_text.startswith("The tool said: sunny, 21 C")


async def test_structured_output_is_passed_on_as_a_json_schema(gateway: Gateway) -> None:
    schema: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    async with client(gateway) as sdk:
        response = await sdk.responses.create(
            model="sim-model",
            input=QUESTION,
            text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}},
        )
    assert response.text is not None
    assert response.text.format is not None
    assert response.text.format.type == "json_schema"  # echoed as the SDK parses it
    assert response.status in ("completed", "incomplete")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "sim-model"}, "input"),
        ({"model": "sim-model", "input": [{"type": "image_generation_call", "id": "x"}]}, "input[0].type"),
        (
            {"model": "sim-model", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
        ),
        ({"model": "sim-model", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "sim-model", "input": "hi", "background": True, "store": False}, "store"),
        ({"model": "sim-model", "input": "hi", "temperature": True}, "temperature"),
        ({"model": "sim-model", "input": "hi", "no_such_parameter": 1}, "no_such_parameter"),
        ({"model": "sim-model", "input": "hi", "tool_choice": "required"}, "tool_choice"),
    ],
)
async def test_a_request_the_gateway_cannot_serve_is_a_400_naming_the_parameter(
    gateway: Gateway, body: dict[str, object], param: str
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(f"{gateway.url}/v1/responses", json=body, headers=gateway.headers(gateway.key))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


async def test_an_unknown_model_is_a_404_the_sdk_understands(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        with pytest.raises(NotFoundError) as raised:
            await sdk.responses.create(model="no-such-model", input=QUESTION)
    assert raised.value.code == "model_not_found"


async def test_a_key_without_the_chat_scope_is_refused(gateway: Gateway) -> None:
    _, approver = gateway.create_key(scopes=["approver"])
    async with client(gateway, approver) as sdk:
        with pytest.raises(Exception) as raised:  # noqa: PT011 - the status is what is checked
            await sdk.responses.create(model="sim-model", input=QUESTION)
    assert getattr(raised.value, "status_code", None) == 403
    assert not isinstance(raised.value, BadRequestError)


async def test_every_response_is_audited_under_its_surface(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        response = await sdk.responses.with_raw_response.create(model="sim-model", input=QUESTION, max_output_tokens=3)
    request_id = response.headers["x-request-id"]
    records = audit_records(gateway, "request", lambda rs: any(r.get("request_id") == request_id for r in rs))
    (record,) = [r for r in records if r.get("request_id") == request_id]
    assert record["surface"] == "responses"
    assert record["completion_tokens"] == 3
