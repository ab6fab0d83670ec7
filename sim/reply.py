"""Turning a chat-completions request body into the reply the sim will deliver.

Everything about the reply except timing and faults is decided here, before a byte is sent, so the
streaming and non-streaming paths deliver the same content and usage for the same request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.text import (
    Message,
    content_text,
    continue_tokens,
    count_prompt_tokens,
    generate_tokens,
    remaining_tokens,
    seed_digest,
)
from sim.tools import ToolCall, plan_tool_call, wants_tool_call

# Far beyond any demo or load test, but keeps one request from allocating unbounded memory.
MAX_TOKENS_LIMIT = 131_072


class RequestError(ValueError):
    """A request the sim refuses with 400; `param` names the offending field as OpenAI does."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send back: text tokens, or a single tool call, plus the usage figures."""

    model: str
    stream: bool
    include_usage: bool
    tokens: tuple[str, ...]
    tool_call: ToolCall | None
    finish_reason: str
    prompt_tokens: int
    reported_usage: int | float | None = None  # a fault: every usage figure says this instead

    @property
    def steps(self) -> int:
        """How many timed emissions the reply takes; positional faults count these."""
        if self.tool_call is None:
            return len(self.tokens)
        return 1 + len(self.tool_call.fragments())

    @property
    def completion_tokens(self) -> int:
        return self.steps

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def plan_reply(body: object, *, echo_tool_results: bool = False) -> Reply:
    """Validate (minimally) a request body and decide the reply; raises `RequestError`.

    With `echo_tool_results`, the answer to a tool result quotes it ("The tool said: ..."), so an
    agent run through the sim ends with what its tool returned; it is still deterministic and
    prefix-consistent, so a stream broken mid-answer is continued exactly."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("you must provide a model parameter", "model")
    messages = _messages(body.get("messages"))
    max_tokens = _max_tokens(body)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    prefix = trailing_prefill(messages)
    # A continued answer's prefix is prompt, but not a new turn: vLLM's continue_final_message
    # reuses the generation prompt the first request had, so only the prefix's own tokens add.
    prompt_tokens = (
        count_prompt_tokens(messages) if prefix is None else count_prompt_tokens(messages[:-1]) + len(prefix.split())
    )
    common: dict[str, Any] = {
        "model": model,
        "stream": stream,
        "include_usage": include_usage,
        "prompt_tokens": prompt_tokens,
    }
    answered = messages[:-1] if prefix is not None else messages
    if echo_tool_results and answered and answered[-1].get("role") == "tool":
        return _quote_tool_result(answered[-1], prefix or "", max_tokens, common)
    if prefix is not None:
        tokens = continue_tokens(model, messages[:-1], prefix, max_tokens)
        return Reply(tokens=tuple(tokens), tool_call=None, finish_reason=_finish(max_tokens), **common)
    if wants_tool_call(messages, body.get("tools"), body.get("tool_choice")):
        call = plan_tool_call(seed_digest(model, messages), body.get("tools"), body.get("tool_choice"))
        return Reply(tokens=(), tool_call=call, finish_reason="tool_calls", **common)
    tokens = generate_tokens(model, messages, max_tokens)
    return Reply(tokens=tuple(tokens), tool_call=None, finish_reason=_finish(max_tokens), **common)


def _quote_tool_result(message: Message, prefix: str, max_tokens: int | None, common: dict[str, Any]) -> Reply:
    words = f"The tool said: {content_text(message.get('content'))}".split(" ")
    tokens = [words[0], *(" " + word for word in words[1:])]
    rest = remaining_tokens(tokens, prefix) if prefix else tokens
    rest = rest if rest is not None else []
    finish = "stop"
    if max_tokens is not None and len(rest) > max_tokens:
        rest, finish = rest[:max_tokens], "length"
    return Reply(tokens=tuple(rest), tool_call=None, finish_reason=finish, **common)


def trailing_prefill(messages: list[Message]) -> str | None:
    """The partial assistant reply to continue, if the conversation ends with one.

    Both the vLLM/SGLang `continue_final_message` flag and llama.cpp's bare trailing assistant
    message mean the same thing here, so the flag itself need not be consulted.
    """
    last = messages[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content")
    if not isinstance(content, str | list):
        return None
    return content_text(content)


def _finish(max_tokens: int | None) -> str:
    # The sim always produces exactly max_tokens when a limit is given, so the limit is always hit.
    return "stop" if max_tokens is None else "length"


def _messages(value: object) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty array", "messages")
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{index}] must be an object", f"messages[{index}]")
    return value


def _max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS_LIMIT:
            raise RequestError(f"{name} must be an integer between 1 and {MAX_TOKENS_LIMIT}", name)
        return value
    return None


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be a boolean", name)
    return value
