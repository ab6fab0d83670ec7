"""Every kind of bad input gets a 4xx in OpenAI's error shape, naming the problem; never a 500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway

GOOD = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}

CASES: list[tuple[str, Any, int, str, str | None]] = [
    ("invalid JSON", b"{not json", 400, "invalid_json", None),
    ("empty body", b"", 400, "invalid_json", None),
    ("JSON array body", [1, 2], 400, "invalid_json", None),
    ("missing messages", {"model": "sim-model"}, 400, "missing_required_parameter", "messages"),
    ("empty messages", {**GOOD, "messages": []}, 400, "invalid_value", "messages"),
    ("messages not a list", {**GOOD, "messages": "hi"}, 400, "invalid_value", "messages"),
    (
        "unknown role",
        {**GOOD, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "invalid_value",
        "messages[0].role",
    ),
    (
        "content of wrong type",
        {**GOOD, "messages": [{"role": "user", "content": 5}]},
        400,
        "invalid_value",
        "messages[0].content",
    ),
    ("missing model", {"messages": GOOD["messages"]}, 400, "missing_required_parameter", "model"),
    ("model not a string", {**GOOD, "model": 7}, 400, "invalid_value", "model"),
    ("unknown model", {**GOOD, "model": "gpt-nope"}, 404, "model_not_found", "model"),
    ("stream not a boolean", {**GOOD, "stream": "yes"}, 400, "invalid_value", "stream"),
    ("max_tokens zero", {**GOOD, "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ("temperature out of range", {**GOOD, "temperature": 3}, 400, "invalid_value", "temperature"),
    ("n greater than one", {**GOOD, "n": 2}, 400, "unsupported_parameter", "n"),
    (
        "tool without function",
        {**GOOD, "tools": [{"type": "function"}]},
        400,
        "missing_required_parameter",
        "tools[0].function",
    ),
    ("tool_choice without tools", {**GOOD, "tool_choice": "required"}, 400, "invalid_request", "tool_choice"),
]


@pytest.fixture(scope="module")
def small_limit_gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = tmp_path_factory.mktemp("limits")
    config = gateway_config(deployment("a", sim_pair[0]), server={"max_body_bytes": 4096})
    with running_gateway(path, config) as gateway:
        yield gateway


def post(gateway: Gateway, body: Any, **kwargs: Any) -> httpx.Response:
    url = f"{gateway.url}/v1/chat/completions"
    if isinstance(body, bytes):
        headers = {"content-type": "application/json", **gateway.headers()}
        return httpx.post(url, content=body, headers=headers, timeout=10, **kwargs)
    return httpx.post(url, json=body, headers=gateway.headers(), timeout=10, **kwargs)


@pytest.mark.parametrize(("case", "body", "status", "code", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_an_openai_shaped_4xx(
    shared_gateway: Gateway, case: str, body: Any, status: int, code: str, param: str | None
) -> None:
    reply = post(shared_gateway, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]


def test_body_over_the_limit_is_413(small_limit_gateway: Gateway) -> None:
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 5000}]}
    reply = post(small_limit_gateway, big)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large"


def test_body_over_the_limit_without_content_length_is_413(small_limit_gateway: Gateway) -> None:
    def chunks() -> Any:
        for _ in range(10):
            yield b"x" * 1000

    reply = httpx.post(
        f"{small_limit_gateway.url}/v1/chat/completions",
        content=chunks(),
        headers=small_limit_gateway.headers(),
        timeout=10,
    )
    assert reply.status_code == 413


def test_unknown_parameters_pass_through_untouched(shared_gateway: Gateway) -> None:
    reply = post(shared_gateway, {**GOOD, "max_tokens": 3, "logit_bias": {"42": 1}, "x_vendor_flag": {"a": [1]}})
    assert reply.status_code == 200


def test_unknown_path_and_wrong_method_are_openai_shaped(shared_gateway: Gateway) -> None:
    missing = httpx.get(f"{shared_gateway.url}/v1/nothing", headers=shared_gateway.headers(), timeout=10)
    wrong = httpx.get(f"{shared_gateway.url}/v1/chat/completions", headers=shared_gateway.headers(), timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "invalid_request_error"


def test_unauthenticated_bad_input_is_401_before_the_body_is_judged(shared_gateway: Gateway) -> None:
    reply = httpx.post(f"{shared_gateway.url}/v1/chat/completions", content=b"{not json", timeout=10)
    assert reply.status_code == 401
