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
    assert translated.echo["store"] is False  # nothing is stored yet: the response does not claim it
