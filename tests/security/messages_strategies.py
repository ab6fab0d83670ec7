"""Hypothesis strategies for Anthropic Messages API requests: mostly the right shape, with wrong
types, unknown block and tool types, odd numbers and deep nesting where a client could put them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.security.strategies import DEEP, JSON, LEAF, TOKEN_LIMIT, TOOL_NAME

TEXT = st.text(max_size=80)
TOOL_ID = st.sampled_from(["toolu_1", "toolu_2"]) | LEAF
TEXT_BLOCK = st.fixed_dictionaries({"type": st.just("text")}, optional={"text": TEXT | LEAF, "cache_control": JSON})
TOOL_USE = st.fixed_dictionaries(
    {"type": st.just("tool_use")},
    optional={"id": TOOL_ID, "name": TOOL_NAME | LEAF, "input": st.just({"city": "a"}) | JSON},
)
TOOL_RESULT = st.fixed_dictionaries(
    {"type": st.just("tool_result")},
    optional={"tool_use_id": TOOL_ID, "content": TEXT | st.lists(TEXT_BLOCK, max_size=2) | JSON, "is_error": LEAF},
)
BLOCK = (
    TEXT_BLOCK
    | TOOL_USE
    | TOOL_RESULT
    | st.fixed_dictionaries({"type": st.sampled_from(["image", "thinking"]) | TEXT})
    | JSON
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]) | LEAF},
    optional={"content": TEXT | st.lists(BLOCK, max_size=3) | JSON},
)
TOOL = st.fixed_dictionaries(
    {"name": TOOL_NAME | LEAF},
    optional={
        "input_schema": st.just({"type": "object"}) | JSON,
        "type": st.sampled_from(["custom", "bash_20250124"]) | LEAF,
    },
)
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
# Bodies a client could well send: these reach the sim, stream, and call the whitelisted tool.
VALID_BODY = st.fixed_dictionaries(
    {
        "model": st.just("sim-model"),
        "max_tokens": st.integers(min_value=1, max_value=8),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXT}),
            min_size=1,
            max_size=3,
        ),
    },
    optional={
        "system": TEXT,
        "tools": st.just([WEATHER]),
        "stream": st.booleans(),
        "temperature": st.floats(min_value=0, max_value=1),
        "stop_sequences": st.lists(st.text(min_size=1, max_size=4), max_size=2),
        "metadata": st.fixed_dictionaries({"user_id": st.text(max_size=8)}),
    },
)
MESSAGES_BODY: st.SearchStrategy[Any] = st.one_of(
    VALID_BODY,
    VALID_BODY,
    st.fixed_dictionaries(
        {"model": st.just("sim-model") | LEAF, "messages": st.lists(MESSAGE, max_size=4) | LEAF},
        optional={
            "max_tokens": TOKEN_LIMIT,
            "system": TEXT | st.lists(TEXT_BLOCK | JSON, max_size=2) | LEAF,
            "tools": st.lists(TOOL, max_size=2) | LEAF,
            "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none"]) | LEAF})
            | JSON,
            "stop_sequences": JSON,
            "temperature": LEAF,
            "top_k": LEAF,
            "metadata": JSON,
            "stream": st.booleans() | LEAF,
            "thinking": JSON,
            "bogus": LEAF,
        },
    ),
    DEEP,
    JSON,
)
