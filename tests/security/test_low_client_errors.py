"""Low: input a client controls gets a 4xx in OpenAI's error shape, never a 500 or a cut stream;
an upstream's own error text never reaches the client."""

from __future__ import annotations

import httpx
import pytest

from testkit.procs import Gateway
from tests.security.helpers import CHAT, assert_openai_error, chat
from tests.security.scripted_upstream import LEAKED

BAD_AFTER = ["²", "١٢", "9" * 5000, "99999999999999999999999", "-1", "1e3", " 7"]


@pytest.fixture(scope="module")
def session_id(gateway: Gateway) -> str:
    reply = chat(gateway, {**CHAT, "stream": True})
    assert reply.status_code == 200
    return reply.headers["x-session-id"]


@pytest.mark.parametrize("value", BAD_AFTER, ids=range(len(BAD_AFTER)))
def test_low_bad_last_event_id_is_400(gateway: Gateway, session_id: str, value: str) -> None:
    url = f"{gateway.url}/v1/sessions/{session_id}/stream"
    by_query = httpx.get(url, params={"after": value}, headers=gateway.headers(), timeout=10)
    assert_openai_error(by_query, 400)
    if value.strip() == value:  # (a header value cannot start with a space)
        # As bytes, all of them: the value may not be ASCII, and httpx takes str or bytes headers, not both.
        header = {**{k.encode(): v.encode() for k, v in gateway.headers().items()}, b"Last-Event-ID": value.encode()}
        assert_openai_error(httpx.get(url, headers=header, timeout=10), 400)


def test_low_good_last_event_id_still_resumes(gateway: Gateway, session_id: str) -> None:
    url = f"{gateway.url}/v1/sessions/{session_id}/stream"
    reply = httpx.get(url, headers={**gateway.headers(), "Last-Event-ID": "1"}, timeout=10)
    assert reply.status_code == 200
    assert "[DONE]" in reply.text


MALFORMED_CALLS = [
    ["not a dict"],
    [{"id": "c1", "type": "function", "function": "not a dict"}],
    [{"id": "c1", "type": "function", "function": {"name": 5, "arguments": "{}"}}],
    [{"id": 7, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
    [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "a"}}}],
]


@pytest.mark.parametrize("calls", MALFORMED_CALLS, ids=range(len(MALFORMED_CALLS)))
def test_low_malformed_tool_calls_entry_is_400(gateway: Gateway, calls: list[object]) -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    assert_openai_error(chat(gateway, {**CHAT, "messages": messages}), 400)


def test_low_upstream_error_text_is_not_passed_on(scripted: Gateway) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "script:error_400"}]}
    reply = chat(scripted, body)
    assert_openai_error(reply, 400)
    assert LEAKED not in reply.text
    streamed = chat(scripted, {**body, "stream": True})
    assert LEAKED not in streamed.text
