"""Checking one assertion against one reply; every check returns `(passed, message)`.

The message explains the outcome either way, so a failing release report says what was expected and
what came back without anyone rerunning the case.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import orjson

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

_SHOWN_CHARS = 80


@dataclass(frozen=True, slots=True)
class ReplyToolCall:
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Reply:
    """The parts of a chat completion that assertions look at."""

    content: str
    tool_calls: tuple[ReplyToolCall, ...] = ()
    finish_reason: str | None = None


Outcome = tuple[bool, str]


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…")


def _contains(a: Contains, reply: Reply) -> Outcome:
    found = _find(a.text, reply.content, a.case_sensitive)
    return found, f"{'found' if found else 'missing'} {a.text!r} in {_shown(reply.content)}"


def _not_contains(a: NotContains, reply: Reply) -> Outcome:
    found = _find(a.text, reply.content, a.case_sensitive)
    return not found, f"{'found forbidden' if found else 'no'} {a.text!r} in {_shown(reply.content)}"


def _find(needle: str, haystack: str, case_sensitive: bool) -> bool:
    return needle in haystack if case_sensitive else needle.casefold() in haystack.casefold()


def _regex(a: Regex, reply: Reply) -> Outcome:
    matched = re.search(a.pattern, reply.content) is not None
    return matched, f"{'matches' if matched else 'does not match'} /{a.pattern}/: {_shown(reply.content)}"


def _equals(a: Equals, reply: Reply) -> Outcome:
    content = reply.content.strip() if a.strip else reply.content
    equal = content == a.text
    return equal, f"content {'equals' if equal else 'is'} {_shown(content)}" + ("" if equal else f", not {a.text!r}")


def _max_chars(a: MaxChars, reply: Reply) -> Outcome:
    length = len(reply.content)
    return length <= a.limit, f"{length} chars (limit {a.limit})"


def _schema_errors(instance: Any, schema: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors]


def _json_schema(a: JsonSchema, reply: Reply) -> Outcome:
    try:
        document = orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        return False, f"content is not JSON: {_shown(reply.content)}"
    errors = _schema_errors(document, a.json_schema)
    return (False, "; ".join(errors)) if errors else (True, "content satisfies the schema")


def _tool_call(a: ToolCall, reply: Reply) -> Outcome:
    named = [call for call in reply.tool_calls if call.name == a.name]
    if not named:
        called = ", ".join(call.name for call in reply.tool_calls) or "none"
        return False, f"no call to {a.name!r} (calls: {called})"
    if a.arguments is None:
        return True, f"called {a.name!r}"
    problems = []
    # Any one matching call suffices: a model may call the same tool twice with different arguments.
    for call in named:
        try:
            arguments = orjson.loads(call.arguments)
        except orjson.JSONDecodeError:
            problems.append(f"arguments are not JSON: {_shown(call.arguments)}")
            continue
        errors = _schema_errors(arguments, a.arguments)
        if not errors:
            return True, f"called {a.name!r} with valid arguments"
        problems.extend(errors)
    return False, f"{a.name!r} arguments: " + "; ".join(problems)


def _no_tool_call(_: NoToolCall, reply: Reply) -> Outcome:
    if reply.tool_calls:
        return False, "unexpected tool calls: " + ", ".join(call.name for call in reply.tool_calls)
    return True, "no tool calls"


def _finish_reason(a: FinishReason, reply: Reply) -> Outcome:
    ok = reply.finish_reason == a.value
    return ok, f"finish_reason {reply.finish_reason!r}" + ("" if ok else f", expected {a.value!r}")


def _not(a: Not, reply: Reply) -> Outcome:
    passed, message = check(a.assertion, reply)
    if passed:
        return False, f"not {a.assertion.kind}: the inner assertion passed but must fail ({message})"
    return True, f"not {a.assertion.kind}: the inner assertion failed as required ({message})"


_CHECKS: dict[type[Any], Callable[[Any, Reply], Outcome]] = {
    Contains: _contains,
    NotContains: _not_contains,
    Regex: _regex,
    Equals: _equals,
    MaxChars: _max_chars,
    JsonSchema: _json_schema,
    ToolCall: _tool_call,
    NoToolCall: _no_tool_call,
    FinishReason: _finish_reason,
    Not: _not,
}


def check(assertion: Assertion, reply: Reply) -> Outcome:
    """Run one assertion; `(passed, message)`."""
    return _CHECKS[type(assertion)](assertion, reply)
