from __future__ import annotations

import pytest

from eval.assertions import Reply, ReplyToolCall, check
from eval.sets import (
    Assertion,
    Contains,
    Equals,
    FinishReason,
    JsonSchema,
    MaxChars,
    Not,
    NotContains,
    NoToolCall,
    Regex,
    ToolCall,
)

TEXT = Reply(content="The Quick brown fox", finish_reason="stop")
JSON_REPLY = Reply(content='{"answer": 42}')
CALL = Reply(content="", tool_calls=(ReplyToolCall("get_weather", '{"city": "Paris"}'),), finish_reason="tool_calls")
ARGS_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize(
    ("assertion", "reply", "expected"),
    [
        (Contains(text="Quick"), TEXT, True),
        (Contains(text="quick"), TEXT, False),
        (Contains(text="quick", case_sensitive=False), TEXT, True),
        (NotContains(text="cat"), TEXT, True),
        (NotContains(text="FOX", case_sensitive=False), TEXT, False),
        (Regex(pattern=r"^The \w+"), TEXT, True),
        (Regex(pattern=r"^[a-z ]+$"), TEXT, False),
        (Equals(text="The Quick brown fox"), Reply(content="  The Quick brown fox\n"), True),
        (Equals(text="The Quick brown fox", strip=False), Reply(content="The Quick brown fox\n"), False),
        (MaxChars(limit=19), TEXT, True),
        (MaxChars(limit=18), TEXT, False),
        (JsonSchema(schema={"type": "object", "required": ["answer"]}), JSON_REPLY, True),
        (JsonSchema(schema={"properties": {"answer": {"type": "string"}}}), JSON_REPLY, False),
        (JsonSchema(schema={"type": "object"}), TEXT, False),
        (ToolCall(name="get_weather"), CALL, True),
        (ToolCall(name="get_time"), CALL, False),
        (ToolCall(name="get_weather", arguments=ARGS_SCHEMA), CALL, True),
        (ToolCall(name="get_weather", arguments={**ARGS_SCHEMA, "required": ["day"]}), CALL, False),
        (ToolCall(name="get_weather"), TEXT, False),
        (NoToolCall(), TEXT, True),
        (NoToolCall(), CALL, False),
        (FinishReason(value="stop"), TEXT, True),
        (FinishReason(value="length"), TEXT, False),
    ],
)
def test_each_assertion_kind_passes_and_fails(assertion: Assertion, reply: Reply, expected: bool) -> None:
    passed, message = check(assertion, reply)
    assert passed is expected, message
    assert message


def test_failure_messages_say_what_came_back() -> None:
    assert check(MaxChars(limit=3), TEXT) == (False, "19 chars (limit 3)")
    assert check(FinishReason(value="length"), TEXT) == (False, "finish_reason 'stop', expected 'length'")
    assert check(ToolCall(name="x"), CALL) == (False, "no call to 'x' (calls: get_weather)")
    _, message = check(JsonSchema(schema={"properties": {"answer": {"type": "string"}}}), JSON_REPLY)
    assert message == "answer: 42 is not of type 'string'"


def test_tool_call_with_unparseable_arguments_fails() -> None:
    reply = Reply(content="", tool_calls=(ReplyToolCall("get_weather", "{city:"),))
    passed, message = check(ToolCall(name="get_weather", arguments=ARGS_SCHEMA), reply)
    assert not passed
    assert "arguments are not JSON" in message


def test_tool_call_passes_when_any_call_of_that_name_has_valid_arguments() -> None:
    calls = (ReplyToolCall("get_weather", "{}"), ReplyToolCall("get_weather", '{"city": "Oslo"}'))
    assert check(ToolCall(name="get_weather", arguments=ARGS_SCHEMA), Reply(content="", tool_calls=calls))[0]


@pytest.mark.parametrize(
    ("inner", "reply", "expected"),
    [
        (Regex(pattern=r"^[a-z ]+$"), TEXT, True),
        (Regex(pattern=r"^The"), TEXT, False),
        (Contains(text="cat"), TEXT, True),
        (NotContains(text="cat"), TEXT, False),
        (ToolCall(name="get_weather"), CALL, False),
        (NoToolCall(), CALL, True),
        (Not(assertion=Regex(pattern="^The")), TEXT, True),
    ],
)
def test_not_passes_exactly_when_the_inner_assertion_fails(inner: Assertion, reply: Reply, expected: bool) -> None:
    assert check(inner, reply)[0] is not expected
    assert check(Not(assertion=inner), reply)[0] is expected


def test_not_message_says_whether_the_inner_assertion_passed() -> None:
    passed, message = check(Not(assertion=Regex(pattern="^The")), TEXT)
    assert not passed
    assert message == "not regex: the inner assertion passed but must fail (matches /^The/: 'The Quick brown fox')"
    passed, message = check(Not(assertion=MaxChars(limit=3)), TEXT)
    assert passed
    assert message == "not max_chars: the inner assertion failed as required (19 chars (limit 3))"
