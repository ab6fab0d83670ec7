from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from eval.runner import request_body, run_eval
from eval.sets import EvalSet, parse_eval_set

BASE_URL = "http://127.0.0.1:9/v1"
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def eval_set(*assertions: dict[str, Any], **case: Any) -> EvalSet:
    return parse_eval_set(
        {
            "id": "s",
            "version": "1",
            "cases": [
                {
                    "id": "c1",
                    "tags": ["t"],
                    "messages": [{"role": "user", "content": "hi"}],
                    "assertions": list(assertions) or [{"contains": "hello"}],
                    **case,
                }
            ],
        }
    )


def completion(content: str = "hello world", finish: str = "stop", **message: Any) -> dict[str, Any]:
    return {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content, **message}, "finish_reason": finish}
        ]
    }


def replying(status: int, body: object, seen: list[httpx.Request] | None = None) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=orjson.dumps(body))

    return httpx.MockTransport(handler)


async def test_passing_case_sends_overrides_and_key_and_records_latency() -> None:
    seen: list[httpx.Request] = []
    the_set = eval_set(request={"max_tokens": 7, "temperature": 0})
    result = await run_eval(the_set, BASE_URL, "sk-1", "m", transport=replying(200, completion(), seen))
    case = result.cases[0]
    assert (case.passed, case.error, case.failures) == (True, None, ())
    assert case.latency_s is not None
    assert str(seen[0].url) == "http://127.0.0.1:9/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-1"
    body = orjson.loads(seen[0].content)
    assert body == {**request_body(the_set.cases[0], "m"), "max_tokens": 7, "temperature": 0}
    assert (body["stream"], body["model"]) == (False, "m")
    assert result.summary.pass_rate == 1.0
    assert result.summary.p50_latency_s == case.latency_s
    assert result.set_digest == the_set.digest


async def test_failed_assertions_are_listed_with_messages() -> None:
    the_set = eval_set({"contains": "hello"}, {"finish_reason": "length"}, {"max_chars": 3})
    result = await run_eval(the_set, BASE_URL, None, "m", transport=replying(200, completion()))
    case = result.cases[0]
    assert not case.passed
    assert case.error is None
    assert [(f.index, f.kind) for f in case.failures] == [(1, "finish_reason"), (2, "max_chars")]
    assert case.failures[1].message == "11 chars (limit 3)"
    assert (result.summary.failed, result.summary.errors, result.summary.pass_rate) == (1, 0, 0.0)


async def test_tool_calls_in_the_reply_reach_the_assertions() -> None:
    call = {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    body = completion(content=None, finish="tool_calls", tool_calls=[call])  # type: ignore[arg-type]
    the_set = eval_set({"tool_call": "get_weather"}, {"finish_reason": "tool_calls"})
    result = await run_eval(the_set, BASE_URL, None, "m", transport=replying(200, body))
    assert result.cases[0].passed


async def test_http_error_is_recorded_with_status_and_code() -> None:
    error = {"error": {"message": "backend down", "type": "server_error", "code": "upstream_unavailable"}}
    result = await run_eval(eval_set(), BASE_URL, None, "m", transport=replying(503, error))
    case = result.cases[0]
    assert case.error == "HTTP 503 upstream_unavailable: backend down"
    assert not case.passed
    assert (result.summary.errors, result.summary.failed, result.summary.mean_latency_s) == (1, 0, None)


async def test_non_json_error_body_is_recorded_as_text() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="bad gateway")

    result = await run_eval(eval_set(), BASE_URL, None, "m", transport=httpx.MockTransport(handler))
    assert result.cases[0].error == "HTTP 502: bad gateway"


async def test_malformed_completion_is_an_error_not_a_failure() -> None:
    result = await run_eval(eval_set(), BASE_URL, None, "m", transport=replying(200, {"choices": []}))
    assert result.cases[0].error is not None
    assert result.cases[0].error.startswith("malformed completion")


async def test_slow_server_hits_the_overall_deadline() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, content=orjson.dumps(completion()))

    result = await run_eval(eval_set(), BASE_URL, None, "m", timeout_s=0.05, transport=httpx.MockTransport(handler))
    case = result.cases[0]
    assert case.error is not None
    assert case.error.startswith("timeout after 0.05s")
    assert case.latency_s is not None
    assert case.latency_s < 2


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (httpx.ReadTimeout("read timed out"), "timeout after 60s (ReadTimeout)"),
        (httpx.ConnectError("refused"), "transport error: ConnectError: refused"),
    ],
)
async def test_transport_exceptions_are_recorded_as_errors(raised: Exception, expected: str) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise raised

    result = await run_eval(eval_set(), BASE_URL, None, "m", transport=httpx.MockTransport(handler))
    assert result.cases[0].error == expected


async def test_concurrency_bounds_requests_in_flight() -> None:
    in_flight = peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return httpx.Response(200, content=orjson.dumps(completion()))

    cases = [
        {"id": f"c{i}", "messages": [{"role": "user", "content": "x"}], "assertions": [{"max_chars": 99}]}
        for i in range(8)
    ]
    the_set = parse_eval_set({"id": "s", "version": "1", "cases": cases})
    result = await run_eval(the_set, BASE_URL, None, "m", concurrency=2, transport=httpx.MockTransport(handler))
    assert peak == 2
    assert [case.case_id for case in result.cases] == [f"c{i}" for i in range(8)]
    assert result.summary.passed == 8


async def test_base_url_without_scheme_is_rejected() -> None:
    with pytest.raises(ValueError, match="http"):
        await run_eval(eval_set(), "127.0.0.1:9/v1", None, "m")


async def test_weights_threshold_and_not_assertions_reach_the_result() -> None:
    data = {
        "id": "s",
        "version": "2",
        "threshold": 0.7,
        "cases": [
            {
                "id": "heavy",
                "weight": 3,
                "messages": [{"role": "user", "content": "hi"}],
                "assertions": [{"not": {"contains": "goodbye"}}],
            },
            {
                "id": "light",
                "messages": [{"role": "user", "content": "hi"}],
                "assertions": [{"not": {"regex": "^hello"}}],
            },
        ],
    }
    the_set = parse_eval_set(data)
    result = await run_eval(the_set, BASE_URL, None, "m", transport=replying(200, completion()))
    heavy, light = result.cases
    assert (heavy.passed, heavy.weight, light.passed, light.weight) == (True, 3.0, False, 1.0)
    assert [(f.index, f.kind) for f in light.failures] == [(0, "not")]
    assert "the inner assertion passed but must fail" in light.failures[0].message
    assert (result.summary.pass_rate, result.summary.score) == (0.5, 0.75)
    assert (result.set_id, result.set_version, result.set_threshold) == ("s", "2", 0.7)
