"""A Responses request in the kernel's chat form: every parameter mapped, kept, or refused."""

from __future__ import annotations

from gateway.surfaces.responses_request import translate


def test_instructions_come_first_and_a_string_input_is_the_users_message() -> None:
    chat = translate({"model": "m", "input": "hi", "instructions": "Be brief."}).chat
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_parallel_function_calls_of_one_turn_are_one_assistant_message() -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "two cities"}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city":"a"}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city":"b"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sun"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call", "call_id": "c3", "name": "w", "arguments": "{}"},
    ]
    messages = translate({"model": "m", "input": items}).chat["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": "rain"}
    assert [c["id"] for c in messages[4]["tool_calls"]] == ["c3"]


def test_function_tools_structured_output_and_limits_map_onto_the_chat_request() -> None:
    schema = {"type": "object", "properties": {}}
    translated = translate(
        {
            "model": "m",
            "input": "hi",
            "tools": [{"type": "function", "name": "w", "parameters": schema, "strict": True}],
            "tool_choice": {"type": "function", "name": "w"},
            "max_output_tokens": 7,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}},
            "metadata": {"run": "1"},
            "stream": True,
        }
    )
    chat = translated.chat
    assert chat["tools"] == [{"type": "function", "function": {"name": "w", "parameters": schema, "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["max_tokens"] == 7
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    assert chat["stream_options"] == {"include_usage": True}
    assert "metadata" not in chat
    assert translated.echo["metadata"] == {"run": "1"}
    assert translated.continuity.store  # kept unless the request says otherwise, as at OpenAI


def test_a_kept_request_names_its_instructions_and_gives_every_input_item_an_id() -> None:
    translated = translate(
        {
            "model": "m",
            "instructions": "Be brief",
            "previous_response_id": "resp_1",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sun"},
            ],
        }
    )
    continuity = translated.continuity
    assert (continuity.previous, continuity.preamble) == ("resp_1", 1)
    assert translated.chat["messages"][0] == {"role": "system", "content": "Be brief"}
    message, call, output = continuity.items
    assert message["content"] == [{"type": "input_text", "text": "hi"}]
    assert call["id"] == "fc_1"  # an id the client sent is kept
    assert message["id"].startswith("msg_")
    assert output["id"].startswith("fco_")
    assert translated.echo["previous_response_id"] == "resp_1"


def test_a_background_request_streams_into_its_session_and_answers_at_once() -> None:
    translated = translate({"model": "m", "input": "hi", "background": True})
    assert translated.stream
    assert translated.chat["stream"]
    assert translated.continuity.background
    assert not translated.continuity.background_events
    assert translate({"model": "m", "input": "hi", "background": True, "stream": True}).continuity.background_events


def test_a_request_not_kept_carries_no_items() -> None:
    assert translate({"model": "m", "input": "hi", "store": False}).continuity.items == ()
