from __future__ import annotations

import random
import re
from typing import Any

import orjson

from sim.text import VOCABULARY, seed_digest
from sim.tools import arguments_for, plan_tool_call, wants_tool_call

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "threshold": {"type": "number"},
                "metric": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filters": {"type": "object"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "note": {"type": ["null", "string"]},
                "optional": {"type": "string"},
            },
            "required": ["city", "days", "threshold", "metric", "tags", "filters", "unit", "note"],
        },
    },
}
SEARCH: dict[str, Any] = {
    "type": "function",
    "function": {"name": "search", "parameters": {"type": "object", "properties": {}, "required": []}},
}
USER = [{"role": "user", "content": "weather in paris?"}]


def test_arguments_cover_every_required_property_with_the_schema_type() -> None:
    arguments = arguments_for(WEATHER["function"]["parameters"], random.Random(1))
    assert set(arguments) == {"city", "days", "threshold", "metric", "tags", "filters", "unit", "note"}
    assert arguments["city"] in VOCABULARY
    assert isinstance(arguments["days"], int)
    assert not isinstance(arguments["days"], bool)
    assert isinstance(arguments["threshold"], float)
    assert isinstance(arguments["metric"], bool)
    assert arguments["tags"] == []
    assert arguments["filters"] == {}
    assert arguments["unit"] == "celsius"
    assert isinstance(arguments["note"], str)


def test_missing_or_odd_schemas_give_empty_arguments() -> None:
    rng = random.Random(0)
    assert arguments_for(None, rng) == {}
    assert arguments_for({"type": "object"}, rng) == {}
    assert arguments_for({"required": "city"}, rng) == {}


def test_tool_call_is_deterministic_and_named_choice_wins() -> None:
    digest = seed_digest("sim-model", USER)
    tools = [WEATHER, SEARCH]
    first = plan_tool_call(digest, tools, "auto")
    assert first == plan_tool_call(digest, tools, "auto")
    assert first.id.startswith("call_")
    assert len(first.id) == len("call_") + 24
    named = plan_tool_call(digest, tools, {"type": "function", "function": {"name": "get_weather"}})
    assert named.name == "get_weather"
    assert set(orjson.loads(named.arguments)) >= {"city", "unit"}


def test_fragments_join_back_to_the_arguments_json() -> None:
    digest = seed_digest("sim-model", USER)
    call = plan_tool_call(digest, [WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    fragments = call.fragments()
    assert len(fragments) > 3
    assert "".join(fragments) == call.arguments
    assert orjson.loads("".join(fragments))["unit"] == "celsius"


def test_tool_call_only_when_tools_offered_enabled_and_not_answering_a_tool_result() -> None:
    assert wants_tool_call(USER, [WEATHER], None)
    assert wants_tool_call(USER, [WEATHER], "required")
    assert not wants_tool_call(USER, [WEATHER], "none")
    assert not wants_tool_call(USER, [], None)
    assert not wants_tool_call(USER, [{"type": "function"}], None)
    after_tool = [*USER, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert not wants_tool_call(after_tool, [WEATHER], "auto")


def test_constrained_values_satisfy_their_schema_without_enum_tricks() -> None:
    """A natural schema (ids by pattern, amounts with bounds) gets values a policy can accept."""
    parameters = {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^ord_[0-9]+$"},
            "customer_id": {"type": "string", "pattern": "^cus_\\d{6}$"},
            "sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{2,4}"},
            "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
            "quantity": {"type": "integer", "minimum": 5, "maximum": 7},
            "reason": {"type": "string", "maxLength": 3},
            "channel": {"type": "string", "examples": ["email", "phone"]},
            "priority": {"type": "string", "default": "normal"},
            "odd": {"type": "string", "pattern": "^(a|b)+$"},  # beyond the subset: a word
        },
        "required": ["order_id", "customer_id", "sku", "amount", "quantity", "reason", "channel", "priority", "odd"],
    }
    for seed in range(50):
        arguments = arguments_for(parameters, random.Random(seed))
        assert re.fullmatch(r"ord_[0-9]+", arguments["order_id"])
        assert re.fullmatch(r"cus_\d{6}", arguments["customer_id"])
        assert re.search(r"[A-Z]{3}-[0-9]{2,4}", arguments["sku"])
        assert 0 < arguments["amount"] <= 1000
        assert 5 <= arguments["quantity"] <= 7
        assert len(arguments["reason"]) <= 3
        assert arguments["channel"] == "email"
        assert arguments["priority"] == "normal"
        assert arguments["odd"] in VOCABULARY
