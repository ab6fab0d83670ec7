"""Deterministic tool calls for the simulated backend.

When a request offers tools, the sim answers with one call whose arguments satisfy the `required`
part of the function's JSON schema. Like the text, the call depends only on the request, so reruns
and other sim processes agree on it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.sim.text import VOCABULARY, Message, digest_rng

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
    """A plausible value for a property schema; unknown schemas get a word."""
    if not isinstance(schema, dict):
        return rng.choice(VOCABULARY)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return value_for(options[0], rng)
    return _value_of_type(_schema_type(schema), rng)


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
