"""Deterministic tool calls for the simulated backend.

When a request offers tools, the sim answers with one call whose arguments satisfy the `required`
part of the function's JSON schema. Like the text, the call depends only on the request, so reruns
and other sim processes agree on it.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sim.patterns import string_matching
from sim.text import VOCABULARY, Message, digest_rng

# Small enough that even a one-property argument object arrives in several pieces, like a real
# server streaming argument tokens.
ARGUMENT_FRAGMENT_CHARS = 6

_JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call: `arguments` is the JSON text a client receives."""

    id: str
    name: str
    arguments: str

    def fragments(self) -> list[str]:
        """The argument text cut into the pieces a stream delivers after the call header."""
        text = self.arguments
        return [text[i : i + ARGUMENT_FRAGMENT_CHARS] for i in range(0, len(text), ARGUMENT_FRAGMENT_CHARS)]

    def as_message_item(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def wants_tool_call(messages: Sequence[Message], tools: object, tool_choice: object) -> bool:
    """Whether the reply is a tool call: tools offered, not disabled, and no tool result to answer."""
    if tool_choice == "none" or not offered_functions(tools):
        return False
    return not messages or messages[-1].get("role") != "tool"


def offered_functions(tools: object) -> list[dict[str, Any]]:
    """The `function` objects of well-formed tool entries; malformed entries are ignored."""
    if not isinstance(tools, list):
        return []
    functions = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            functions.append(function)
    return functions


def plan_tool_call(digest: bytes, tools: object, tool_choice: object) -> ToolCall:
    """The call for a request whose seed digest is `digest`; assumes `wants_tool_call` said yes."""
    functions = offered_functions(tools)
    chosen = _named_choice(tool_choice)
    if chosen is None:
        function = functions[int.from_bytes(digest[8:16], "big") % len(functions)]
    else:
        function = next((f for f in functions if f["name"] == chosen), {"name": chosen})
    arguments = arguments_for(function.get("parameters"), digest_rng(digest, b"arguments"))
    call_id = "call_" + hashlib.sha256(digest + b"call").hexdigest()[:24]
    return ToolCall(id=call_id, name=function["name"], arguments=orjson.dumps(arguments).decode())


def _named_choice(tool_choice: object) -> str | None:
    if not isinstance(tool_choice, dict):
        return None
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def arguments_for(parameters: object, rng: random.Random) -> dict[str, Any]:
    """An argument object with a value for every required property of a JSON object schema."""
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = parameters.get("required")
    names = [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
    return {name: value_for(properties.get(name), rng) for name in names}


def value_for(schema: object, rng: random.Random) -> Any:
    """A plausible value for a property schema; unknown schemas get a word.

    In order: `const`, the first of `enum`, the first of `examples`, `default`, the first option
    of `anyOf` / `oneOf`; otherwise a value of the schema's `type` that keeps to its `pattern`
    (a simple subset: sim/patterns.py), `maxLength`, and `minimum` / `maximum` /
    `exclusiveMinimum` / `exclusiveMaximum`.
    """
    if not isinstance(schema, dict):
        return rng.choice(VOCABULARY)
    if "const" in schema:
        return schema["const"]
    for key in ("enum", "examples"):
        listed = schema.get(key)
        if isinstance(listed, list) and listed:
            return listed[0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return value_for(options[0], rng)
    kind = _schema_type(schema)
    if kind in ("integer", "number"):
        return _bounded_number(kind, schema, rng)
    value = _value_of_type(kind, rng)
    if kind == "string":
        pattern = schema.get("pattern")
        matched = string_matching(pattern, rng) if isinstance(pattern, str) else None
        value = value if matched is None else matched
        max_length = schema.get("maxLength")
        if isinstance(max_length, int) and max_length >= 0:
            value = value[:max_length]
    return value


def _bounded_number(kind: str, schema: dict[str, Any], rng: random.Random) -> int | float:
    """Within the schema's bounds; 0..100 where it sets none (the values before bounds were read)."""
    step = 1.0 if kind == "integer" else 0.01

    def bound(key: str, shift: float = 0.0) -> float | None:
        value = schema.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) + shift

    lows = [b for b in (bound("minimum"), bound("exclusiveMinimum", step)) if b is not None]
    highs = [b for b in (bound("maximum"), bound("exclusiveMaximum", -step)) if b is not None]
    high = min(highs) if highs else None
    low = max(lows) if lows else (0.0 if high is None or high >= 0 else high - 100.0)
    high = max(low, high if high is not None else low + 100.0)  # contradictory bounds: the lower one
    if kind == "integer":
        return rng.randint(math.ceil(low), max(math.ceil(low), math.floor(high)))
    return round(rng.uniform(low, high), 2)


def _schema_type(schema: dict[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        # `["string", "null"]` style: use the first real type.
        declared = next((t for t in declared if t in _JSON_TYPES), None)
    return declared if isinstance(declared, str) else "string"


def _value_of_type(kind: str, rng: random.Random) -> Any:
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return []
    if kind == "object":
        return {}
    if kind == "null":
        return None
    return rng.choice(VOCABULARY)
