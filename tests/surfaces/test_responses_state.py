"""Kept responses through the `openai` SDK: retrieve, chain with `previous_response_id`, list
input items, read the events again, delete; another key sees none of it (issue 31)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError
from openai.types.responses import Response

from common.processes import Announced
from testkit.procs import Gateway


def client(gateway: Gateway, key: str | None = None) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key or gateway.key, max_retries=0, timeout=10)


def backend_answer(sim: Announced, messages: list[dict[str, Any]]) -> tuple[str, int]:
    """(text, prompt tokens) of the backend asked directly with `messages`."""
    body = {"model": "sim-model", "messages": messages, "max_tokens": 8}
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10).json()
    return str(reply["choices"][0]["message"]["content"]), int(reply["usage"]["prompt_tokens"])


async def test_a_three_turn_chain_sends_only_the_new_turn_and_the_backend_sees_the_whole_conversation(
    gateway: Gateway, echo_sim: Announced
) -> None:
    async with client(gateway) as sdk:
        first = await sdk.responses.create(
            model="sim-model", input="Alpha", instructions="Be brief", max_output_tokens=8
        )
        second = await sdk.responses.create(
            model="sim-model", input="Bravo", previous_response_id=first.id, max_output_tokens=8
        )
        third = await sdk.responses.create(
            model="sim-model",
            input="Charlie",
            previous_response_id=second.id,
            instructions="Be thorough",
            max_output_tokens=8,
        )
    # The first turn's instructions are not inherited (as OpenAI documents); the third's come first.
    conversation = [
        {"role": "system", "content": "Be thorough"},
        {"role": "user", "content": "Alpha"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Bravo"},
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "Charlie"},
    ]
    text, prompt_tokens = backend_answer(echo_sim, conversation)
    assert third.output_text == text
    assert third.usage is not None
    assert third.usage.input_tokens == prompt_tokens
    assert (second.previous_response_id, third.previous_response_id) == (first.id, second.id)
    assert third.to_dict()["store"] is True


async def test_a_streamed_response_is_continued_the_moment_its_stream_ends(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        async with sdk.responses.stream(model="sim-model", input="Alpha") as stream:
            streamed = await stream.get_final_response()
        # No wait: the next turn names it at once (its checkpoint may still be on its way).
        following = await sdk.responses.create(
            model="sim-model", input="Bravo", previous_response_id=streamed.id, max_output_tokens=8
        )
        items = [item async for item in sdk.responses.input_items.list(following.id, order="asc")]
    assert [getattr(item, "role", item.type) for item in items] == ["user", "assistant", "user"]
    assert items[1].id == streamed.output[0].to_dict()["id"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_kept_response_is_retrieved_as_its_client_got_it(gateway: Gateway, stream: bool) -> None:
    async with client(gateway) as sdk:
        if stream:  # the raw events: the SDK's stream helper adds fields of its own (`parsed`)
            events = [
                event async for event in await sdk.responses.create(model="sim-model", input="Delta", stream=True)
            ]
            made = events[-1].response  # type: ignore[union-attr]
        else:
            made = await sdk.responses.create(model="sim-model", input="Delta", max_output_tokens=8)
        retrieved = await sdk.responses.retrieve(made.id)
    assert retrieved.model_dump() == made.model_dump()


async def test_input_items_list_the_chain_newest_first_in_pages(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        first = await sdk.responses.create(model="sim-model", input="Alpha", max_output_tokens=4)
        second = await sdk.responses.create(
            model="sim-model",
            input=[
                {"role": "user", "content": "Bravo"},
                {"role": "user", "content": [{"type": "input_text", "text": "Charlie"}]},
            ],
            previous_response_id=first.id,
            max_output_tokens=4,
        )
        page = await sdk.responses.input_items.list(second.id, limit=2)
        every = [item async for item in sdk.responses.input_items.list(second.id, limit=2)]
        oldest_first = [item async for item in sdk.responses.input_items.list(second.id, order="asc")]
    assert len(page.data) == 2
    assert page.has_more
    assert [item.id for item in every] == [item.id for item in reversed(oldest_first)]
    texts = [item.content[0].text for item in oldest_first if item.type == "message"]  # type: ignore[union-attr]
    assert texts == ["Alpha", first.output_text, "Bravo", "Charlie"]
    assert len({item.id for item in every}) == 4


async def test_a_response_stored_false_is_not_kept(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        made = await sdk.responses.create(model="sim-model", input="Echo", store=False, max_output_tokens=4)
        with pytest.raises(NotFoundError):
            await sdk.responses.retrieve(made.id)
        with pytest.raises(NotFoundError):
            await sdk.responses.create(model="sim-model", input="Foxtrot", previous_response_id=made.id)
    assert made.to_dict()["store"] is False


async def test_a_deleted_response_is_gone_and_cannot_be_continued(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        made = await sdk.responses.create(model="sim-model", input="Golf", max_output_tokens=4)
        await sdk.responses.delete(made.id)
        with pytest.raises(NotFoundError):
            await sdk.responses.retrieve(made.id)
        with pytest.raises(NotFoundError):
            await sdk.responses.input_items.list(made.id)
        with pytest.raises(NotFoundError):
            await sdk.responses.create(model="sim-model", input="Hotel", previous_response_id=made.id)
        with pytest.raises(NotFoundError):
            await sdk.responses.delete(made.id)


async def test_another_key_gets_404_for_every_use_of_a_response_it_does_not_own(gateway: Gateway) -> None:
    _, other = gateway.create_key(scopes=["chat"])
    async with client(gateway) as owner:
        made = await owner.responses.create(model="sim-model", input="India", max_output_tokens=4)
    async with client(gateway, other) as stranger:
        for attempt in (
            stranger.responses.retrieve(made.id),
            stranger.responses.input_items.list(made.id),
            stranger.responses.delete(made.id),
            stranger.responses.create(model="sim-model", input="Juliet", previous_response_id=made.id),
        ):
            with pytest.raises(NotFoundError) as raised:
                await attempt
            assert "India" not in str(raised.value.body)
    async with client(gateway) as owner:
        assert (await owner.responses.retrieve(made.id)).output_text == made.output_text


async def test_a_kept_streams_events_are_read_again_after_a_sequence_number(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        events = [event async for event in await sdk.responses.create(model="sim-model", input="Kilo", stream=True)]
        made = events[-1].response  # type: ignore[union-attr]
        assert isinstance(made, Response)
        replayed = [event async for event in await sdk.responses.retrieve(made.id, stream=True, starting_after=3)]
    assert [e.model_dump() for e in replayed] == [e.model_dump() for e in events[4:]]


async def test_a_session_header_on_this_api_is_refused(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        with pytest.raises(BadRequestError) as raised:
            await sdk.responses.create(
                model="sim-model", input="Lima", extra_headers={"X-Session-Id": "mine"}, max_output_tokens=4
            )
    assert raised.value.param == "X-Session-Id"


@pytest.mark.parametrize(
    ("query", "param"),
    [("limit=0", "limit"), ("limit=101", "limit"), ("order=up", "order"), ("after=msg_nope", "after")],
)
async def test_a_bad_input_items_query_is_a_400_naming_it(gateway: Gateway, query: str, param: str) -> None:
    async with client(gateway) as sdk:
        made = await sdk.responses.create(model="sim-model", input="Mike", max_output_tokens=4)
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(f"{gateway.url}/v1/responses/{made.id}/input_items?{query}", headers=gateway.headers())
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


async def test_a_background_response_returns_at_once_and_is_followed_to_its_end(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        begun = await sdk.responses.create(model="sim-model", input="November", background=True)
        assert begun.status in ("queued", "in_progress")
        assert begun.background is True
        events = [event async for event in await sdk.responses.retrieve(begun.id, stream=True)]
        ended = await sdk.responses.retrieve(begun.id)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert ended.model_dump() == events[-1].response.model_dump()
    assert ended.status == "completed"
    assert ended.output_text


async def test_a_background_stream_read_in_two_parts_is_one_whole_stream(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        head: list[Any] = []
        async for event in await sdk.responses.create(model="sim-model", input="Oscar", background=True, stream=True):
            head.append(event)
            if len(head) == 5:
                break  # the client goes away; the response goes on
        rest = [
            event async for event in await sdk.responses.retrieve(head[0].response.id, stream=True, starting_after=4)
        ]
    whole = head + rest
    assert [event.sequence_number for event in whole] == list(range(len(whole)))
    assert whole[-1].type == "response.completed"


async def test_a_background_response_must_be_stored(gateway: Gateway) -> None:
    async with client(gateway) as sdk:
        with pytest.raises(BadRequestError) as raised:
            await sdk.responses.create(model="sim-model", input="Papa", background=True, store=False)
    assert raised.value.param == "store"
