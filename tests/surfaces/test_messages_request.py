"""The Messages API request in the kernel's chat form (gateway/surfaces/messages_request.py)."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.surfaces.messages_request import translate


def test_system_blocks_tool_uses_and_results_become_chat_messages_in_order() -> None:
    chat = translate(
        {
            "model": "m",
            "max_tokens": 9,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Looking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "rain", "is_error": True},
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
        }
    ).chat
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Oslo"}'}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Error: rain"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert chat["max_tokens"] == 9


def test_tools_choice_stops_and_sampling_map_onto_the_chat_request() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    translated = translate(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "w", "description": "weather", "input_schema": schema}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "temperature": 0.2,
            "top_k": 5,
            "metadata": {"user_id": "u1"},
            "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
    )
    chat = translated.chat
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": schema, "description": "weather"}}
    ]
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == ("required", False)
    assert (chat["stop"], chat["temperature"], chat["top_k"], chat["user"]) == (["END"], 0.2, 5, "u1")
    assert translated.stream
    assert chat["stream_options"] == {"include_usage": True}
    assert "thinking" not in orjson.dumps(chat).decode()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 3, "messages": "x"}, "messages"),
        ({"model": "m", "max_tokens": 3, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "tool_use"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {
                "model": "m",
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "any"},
            },
            "tool_choice",
        ),
        ({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}], "top_k": 1.5}, "top_k"),
    ],
)
def test_a_request_that_cannot_be_served_names_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        translate(body)
    assert raised.value.param == param
