"""Reading upstream chunks: the plain-text shortcut agrees with the full parse on every shape."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.backends.coalesce import _plain
from gateway.wire import chunk_from_openai, plain_text

HEAD = {"id": "chatcmpl-u", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def event(delta: Any, **choice: Any) -> dict[str, Any]:
    return {**HEAD, "choices": [{"index": 0, "delta": delta, **choice}]}


SHAPES: dict[str, dict[str, Any]] = {
    "text": event({"content": "Hi"}),
    "text, finish null": event({"content": "Hi"}, finish_reason=None),
    "text, logprobs null": event({"content": "Hi"}, logprobs=None, finish_reason=None),
    "no head fields": {"choices": [{"delta": {"content": "Hi"}}]},
    "empty text": event({"content": ""}),
    "null text": event({"content": None}),
    "role and text": event({"role": "assistant", "content": "Hi"}),
    "role null and text": event({"role": None, "content": "Hi"}),
    "reasoning": event({"reasoning_content": "hmm"}),
    "tool call": event({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]}),
    "finish": event({"content": "Hi"}, finish_reason="stop"),
    "logprobs": event({"content": "Hi"}, logprobs={"content": []}),
    "vendor field in delta": event({"content": "Hi", "x_vendor": 1}),
    "vendor field in choice": event({"content": "Hi"}, x_vendor=1),
    "vendor field in chunk": {**event({"content": "Hi"}), "system_fingerprint": "fp"},
    "usage": {**event({"content": "Hi"}), "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
    "second choice": {**HEAD, "choices": [{"index": 1, "delta": {"content": "Hi"}}]},
    "two choices": {**HEAD, "choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 0, "delta": {}}]},
    "no choices": {**HEAD, "choices": []},
    "choices not a list": {**HEAD, "choices": {"index": 0}},
    "choice not an object": {**HEAD, "choices": ["Hi"]},
    "delta not an object": event("Hi"),
    "text not a string": event({"content": 7}),
}


SHORTCUT = {"text", "text, finish null", "text, logprobs null", "no head fields"}


@pytest.mark.parametrize("name", SHAPES)
def test_the_shortcut_takes_only_chunks_the_full_parse_calls_plain_content(name: str) -> None:
    payload = SHAPES[name]
    text = plain_text(payload)
    assert (text is not None) == (name in SHORTCUT)
    if text is not None:
        chunk = chunk_from_openai(payload)
        assert _plain(chunk)
        assert chunk.content == text


@pytest.mark.parametrize("name", ["text not a string", "delta not an object", "choice not an object"])
def test_a_malformed_chunk_is_left_to_the_full_parse_which_refuses_it(name: str) -> None:
    assert plain_text(SHAPES[name]) is None
    with pytest.raises((AttributeError, TypeError)):
        chunk_from_openai(SHAPES[name])
