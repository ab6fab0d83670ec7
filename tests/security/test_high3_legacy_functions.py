"""High 3: the legacy `functions` / `function_call` API and `role: "function"` messages are refused
with a 400 (they bypassed the tool policy); a legacy `function_call` from an upstream never
reaches the client."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.procs import Gateway
from tests.security.helpers import CHAT, assert_openai_error, chat

FUNCTION = {"name": "delete_repo", "parameters": {"type": "object", "properties": {}}}

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("functions", {**CHAT, "functions": [FUNCTION]}, "functions"),
    ("function_call", {**CHAT, "function_call": {"name": "delete_repo"}}, "function_call"),
    (
        "function role",
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "function", "name": "delete_repo", "content": "done"},
            ],
        },
        "messages[1].role",
    ),
    (
        "assistant function_call",
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "function_call": {"name": "delete_repo", "arguments": "{}"}},
                {"role": "user", "content": "go on"},
            ],
        },
        "messages[1].function_call",
    ),
]


@pytest.mark.parametrize(("case", "body", "param"), REFUSED, ids=[c[0] for c in REFUSED])
def test_high3_legacy_function_api_is_refused(gateway: Gateway, case: str, body: dict[str, Any], param: str) -> None:
    error = assert_openai_error(chat(gateway, body), 400, "unsupported_parameter")
    assert error["param"] == param, case
    assert "tools" in error["message"]


def test_high3_upstream_function_call_never_reaches_the_client(scripted: Gateway) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "script:legacy_function_call"}]}
    reply = chat(scripted, body)
    assert "delete_repo" not in reply.text
    assert "function_call" not in reply.text
    streamed = chat(scripted, {**body, "stream": True})
    assert "delete_repo" not in streamed.text
