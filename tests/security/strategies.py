"""Hypothesis strategies for chat-completions requests: mostly the right shape, with wrong types,
unicode, huge and odd numbers, deep nesting and legacy fields mixed in where a client could."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.security.helpers import nested

# Latin-1 printable, as bytes: what an HTTP header can carry.
HEADER_TEXT = (
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_categories=["Cc"]), max_size=300)
    .map(str.strip)
    .map(lambda text: text.encode("latin-1"))
)

LEAF: st.SearchStrategy[Any] = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
JSON: st.SearchStrategy[Any] = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=15,
)
# Around the limits that matter: the gateway's (64), orjson's encoder (254) and decoder (1024).
DEEP = st.sampled_from([300, 256, 1025, 65, 64, 255, 1023, 63]).map(nested)

ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]) | st.text(max_size=6)
CONTENT = (
    st.text(max_size=200)
    | st.none()
    | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)}), max_size=3)
    | JSON
)
TOOL_NAME = st.sampled_from(["get_weather", "delete_repo"]) | st.text(max_size=10)
TOOL_CALL = (
    st.fixed_dictionaries(
        {
            "id": st.sampled_from(["call_1", "call_2"]) | LEAF,
            "type": st.just("function") | LEAF,
            "function": st.fixed_dictionaries(
                {"name": TOOL_NAME | LEAF, "arguments": st.sampled_from(["{}", '{"city":"a"}']) | st.text() | LEAF}
            )
            | JSON,
        }
    )
    | JSON
)
MESSAGE = st.fixed_dictionaries(
    {"role": ROLE | LEAF},
    optional={
        "content": CONTENT,
        "tool_calls": st.lists(TOOL_CALL, max_size=2) | LEAF,
        "tool_call_id": st.sampled_from(["call_1", "call_2"]) | LEAF,
        "name": st.text(max_size=6),
        "function_call": JSON,
    },
)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function") | LEAF,
        "function": st.fixed_dictionaries(
            {"name": TOOL_NAME | LEAF}, optional={"parameters": st.just({"type": "object"}) | JSON}
        )
        | JSON,
    }
)
# A valid limit stays small (the sim streams that many tokens); invalid ones are anything else.
TOKEN_LIMIT = st.integers(min_value=1, max_value=8) | st.integers(max_value=0) | st.integers(min_value=131_073) | LEAF

BODY: st.SearchStrategy[Any] = st.fixed_dictionaries(
    {
        "model": st.just("sim-model") | st.text(max_size=12) | LEAF,
        "messages": st.lists(MESSAGE, max_size=4) | JSON,
    },
    optional={
        "stream": st.booleans() | LEAF,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | LEAF}) | LEAF,
        "max_tokens": TOKEN_LIMIT,
        "max_completion_tokens": TOKEN_LIMIT,
        "temperature": st.floats(min_value=0, max_value=2) | LEAF,
        "top_p": LEAF,
        "n": st.just(1) | LEAF,
        "tools": st.lists(TOOL, max_size=2) | LEAF,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON,
        "functions": JSON,
        "function_call": JSON,
        "vendor_extension": JSON | DEEP,
    },
)

# --- mostly valid requests, and one change away from valid ---------------------------------------
TEXT = st.text(max_size=200)  # any unicode (no lone surrogates: those are in the wild bodies)
VALID_MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer"]), "content": TEXT}),
    min_size=1,
    max_size=3,
) | st.just(
    [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"a"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
)
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
VALID_BODY: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"model": st.just("sim-model"), "messages": VALID_MESSAGES, "max_tokens": st.integers(min_value=1, max_value=8)},
    optional={
        "stream": st.booleans(),
        "stream_options": st.just({"include_usage": True}),
        "temperature": st.floats(min_value=0, max_value=2),
        "tools": st.just([WEATHER_TOOL]),
        "user": TEXT,
        "seed": st.integers(min_value=-(2**70), max_value=2**70),
    },
)
MUTATION_KEYS = st.sampled_from(
    [
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "tools",
        "tool_choice",
        "n",
        "functions",
        "function_call",
        "vendor_extension",
    ]
)


@st.composite
def one_change(draw: st.DrawFn) -> dict[str, Any]:
    """A valid body with one parameter replaced by anything (deep nesting included)."""
    body = draw(VALID_BODY)
    body[draw(MUTATION_KEYS)] = draw(st.one_of(JSON, DEEP, TOKEN_LIMIT))
    return body


@st.composite
def deep_content(draw: st.DrawFn) -> dict[str, Any]:
    """Deep nesting where the gateway looks (message content), not only where it passes through."""
    body = draw(VALID_BODY)
    part = {"type": "text", "text": "x", "extra": draw(DEEP)}
    return {**body, "messages": [*body["messages"], {"role": "user", "content": [part]}]}


@st.composite
def one_message_changed(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(VALID_BODY)
    messages = list(body["messages"])
    messages[draw(st.integers(min_value=0, max_value=len(messages) - 1))] = draw(MESSAGE)
    return {**body, "messages": messages}


@st.composite
def tool_exchange_changed(draw: st.DrawFn) -> dict[str, Any]:
    """A call and its result, with the call (or the result's reference) replaced by anything."""
    call = draw(TOOL_CALL)
    answer = {"role": "tool", "tool_call_id": draw(st.sampled_from(["call_1", "call_2"]) | LEAF), "content": "r"}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        answer,
    ]
    if draw(st.booleans()):
        messages.append(answer)  # answered twice
    return {"model": "sim-model", "messages": messages, "max_tokens": 4, "tools": [WEATHER_TOOL]}


REQUEST_BODY: st.SearchStrategy[Any] = st.one_of(
    VALID_BODY, one_change(), one_message_changed(), tool_exchange_changed(), deep_content(), BODY
)
