"""Hypothesis strategies for Responses API requests: mostly the right shape, with wrong types,
unknown item and part types, odd numbers and deep nesting where a client could put them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.security.strategies import DEEP, JSON, LEAF, TOKEN_LIMIT, TOOL_NAME

TEXT = st.text(max_size=80)
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "refusal"]) | LEAF},
    optional={"text": TEXT | LEAF},
)
CONTENT = TEXT | st.lists(PART, max_size=3) | JSON
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer", "assistant", "tool"]) | LEAF},
    optional={"type": st.just("message") | LEAF, "content": CONTENT},
)
CALL_ID = st.sampled_from(["call_1", "call_2"]) | LEAF
FUNCTION_CALL = st.fixed_dictionaries(
    {"type": st.just("function_call")},
    optional={
        "call_id": CALL_ID,
        "name": TOOL_NAME | LEAF,
        "arguments": st.sampled_from(["{}", '{"city":"a"}']) | LEAF,
    },
)
FUNCTION_OUTPUT = st.fixed_dictionaries(
    {"type": st.just("function_call_output")}, optional={"call_id": CALL_ID, "output": CONTENT | LEAF}
)
ITEM = MESSAGE | FUNCTION_CALL | FUNCTION_OUTPUT | st.fixed_dictionaries({"type": TEXT}) | JSON
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "web_search", "mcp"]) | LEAF},
    optional={"name": TOOL_NAME | LEAF, "parameters": st.just({"type": "object"}) | JSON, "strict": LEAF},
)
FORMAT = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "json_object", "json_schema"]) | LEAF},
    optional={"name": TEXT | LEAF, "schema": st.just({"type": "object"}) | JSON},
)
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
VALID_INPUT = TEXT | st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer"]), "content": TEXT}),
    min_size=1,
    max_size=3,
)
# Bodies a client could well send: these reach the sim, stream, and call the whitelisted tool.
VALID_BODY = st.fixed_dictionaries(
    {"model": st.just("sim-model"), "input": VALID_INPUT},
    optional={
        "instructions": TEXT,
        "tools": st.just([WEATHER]),
        "max_output_tokens": st.integers(min_value=1, max_value=8),
        "stream": st.booleans(),
        "temperature": st.floats(min_value=0, max_value=2),
        "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=2),
        "text": st.just({"format": {"type": "json_object"}}),
    },
)
RESPONSES_BODY: st.SearchStrategy[Any] = st.one_of(
    VALID_BODY,
    VALID_BODY,
    st.fixed_dictionaries(
        {"model": st.just("sim-model") | LEAF, "input": TEXT | st.lists(ITEM, max_size=4) | LEAF},
        optional={
            "instructions": TEXT | LEAF,
            "tools": st.lists(TOOL, max_size=2) | LEAF,
            "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON,
            "max_output_tokens": TOKEN_LIMIT,
            "temperature": LEAF,
            "top_p": LEAF,
            "parallel_tool_calls": LEAF,
            "text": st.fixed_dictionaries({}, optional={"format": FORMAT | LEAF}) | LEAF,
            "stream": st.booleans() | LEAF,
            "metadata": JSON,
            "reasoning": JSON,
            "include": JSON,
            "store": LEAF,
            "user": LEAF,
            "previous_response_id": LEAF,
            "background": LEAF,
            "truncation": LEAF,
        },
    ),
    st.fixed_dictionaries({"model": st.just("sim-model"), "input": DEEP}),
    JSON,
)
