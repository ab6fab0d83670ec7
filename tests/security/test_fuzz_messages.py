"""Property-based fuzzing of POST /v1/messages, /v1/messages/count_tokens and /v1/embeddings against
a served gateway (issue 32): no answer is a 5xx or an in-band internal error, none hangs past a
bound, and afterwards the audit chain verifies and no quota lease is left behind (test_fuzz_chat.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import given
from hypothesis import strategies as st

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.security.helpers import SECURITY_POLICY
from tests.security.messages_strategies import MESSAGES_BODY
from tests.security.schema_fuzz import fuzz_schema
from tests.security.strategies import DEEP, JSON, LEAF
from tests.security.test_fuzz_chat import CONCURRENCY, REQUEST_TIMEOUT_S, Tally, run_and_report


@pytest.fixture(scope="module")
def fuzzed(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("fuzz-messages")
    models = [
        {"name": "sim-model", "deployments": [deployment("a", sim_pair[0])]},
        {"name": "sim-embed", "deployments": [deployment("e", sim_pair[0], serves=["embeddings"])]},
    ]
    config = gateway_config(models=models, tools={"policy_file": policy_file(path, SECURITY_POLICY)})
    with running_gateway(path, config) as running:
        _, running.key = running.create_key(max_concurrency=CONCURRENCY, rpm=100_000)
        yield running


def test_fuzz_messages_never_5xx(
    fuzzed: Gateway, record_property: Callable[[str, Any], None], capsys: pytest.CaptureFixture[str]
) -> None:
    tally = Tally()
    headers = {"Content-Type": "application/json", "x-api-key": fuzzed.key, "anthropic-version": "2023-06-01"}

    @given(
        body=MESSAGES_BODY | st.binary(max_size=300).map(lambda raw: ("raw", raw)),
        route=st.sampled_from(["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"]),
    )
    def case(body: Any, route: str) -> None:
        # json.dumps, not orjson: NaN, Infinity and lone surrogates must reach the gateway as they are.
        content = body[1] if isinstance(body, tuple) else json.dumps(body).encode("utf-8", "surrogatepass")
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            reply = client.post(f"{fuzzed.url}{route}", content=content, headers=headers)
        tally.check(reply, repr(content[:300]))

    run_and_report(case, tally, "messages", fuzzed, record_property, capsys)


VALID_EMBEDDINGS = st.fixed_dictionaries(
    {
        "model": st.just("sim-embed"),
        "input": st.text(max_size=40) | st.lists(st.text(max_size=10), min_size=1, max_size=3),
    },
    optional={"encoding_format": st.sampled_from(["float", "base64"]), "dimensions": st.integers(1, 32)},
)
EMBEDDINGS_BODY = VALID_EMBEDDINGS | st.fixed_dictionaries(
    {"model": st.sampled_from(["sim-embed", "sim-model"]) | LEAF},
    optional={
        "input": st.text(max_size=40)
        | st.lists(st.text(max_size=10), max_size=3)
        | st.lists(st.integers(min_value=-2, max_value=50_000), max_size=4)
        | st.lists(st.lists(st.integers(min_value=0, max_value=100), max_size=3), max_size=2)
        | JSON,
        "encoding_format": st.sampled_from(["float", "base64", "int8"]) | LEAF,
        "dimensions": st.integers(min_value=-1, max_value=64) | LEAF,
        "user": LEAF,
        "stream": LEAF,
    },
)


def test_fuzz_embeddings_never_5xx(
    fuzzed: Gateway, record_property: Callable[[str, Any], None], capsys: pytest.CaptureFixture[str]
) -> None:
    tally = Tally()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {fuzzed.key}"}

    @given(body=EMBEDDINGS_BODY | DEEP | st.binary(max_size=200).map(lambda raw: ("raw", raw)))
    def case(body: Any) -> None:
        content = body[1] if isinstance(body, tuple) else json.dumps(body).encode("utf-8", "surrogatepass")
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            reply = client.post(f"{fuzzed.url}/v1/embeddings", content=content, headers=headers)
        tally.check(reply, repr(content[:300]))

    run_and_report(case, tally, "embeddings", fuzzed, record_property, capsys)
    assert tally.statuses[200] > 0, "no case was a request the gateway could serve"


_ANSWERS = {"responses": {"default": {"description": "any"}}}
_TEXT_BLOCK = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string", "maxLength": 30}},
}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {
            "anyOf": [{"type": "string", "maxLength": 30}, {"type": "array", "items": _TEXT_BLOCK, "maxItems": 2}]
        },
    },
}
_BODY = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": {
        "model": {"type": "string", "enum": ["sim-model"]},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 8},
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1, "maxItems": 3},
        "system": {"type": "string", "maxLength": 30},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 4}, "maxItems": 2},
    },
    "additionalProperties": False,
}
# The Messages and embeddings routes are served as Starlette routes, not FastAPI operations: their
# schema is written here, the subset of Anthropic's and OpenAI's documented requests the gateway serves.
_EMBEDDINGS_BODY = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "enum": ["sim-embed"]},
        "input": {
            "anyOf": [
                {"type": "string", "maxLength": 30},
                {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3},
            ]
        },
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1, "maximum": 32},
    },
    "additionalProperties": False,
}
_BODIES = {"/v1/messages": _BODY, "/v1/messages/count_tokens": _BODY, "/v1/embeddings": _EMBEDDINGS_BODY}
MESSAGES_ROUTES_SCHEMA: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Messages and embeddings routes", "version": "1"},
    "paths": {
        route: {
            "post": {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}, **_ANSWERS}
        }
        for route, body in _BODIES.items()
    },
}
SCHEMA_CASES_PER_OPERATION = 15  # per generation mode


def test_schemathesis_on_the_messages_and_embeddings_routes_finds_no_5xx(
    fuzzed: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    headers = {"x-api-key": fuzzed.key, "anthropic-version": "2023-06-01"}  # x-api-key: every route takes it

    def send(case: Any) -> list[Any]:
        return [case.call(base_url=fuzzed.url, headers=headers, timeout=REQUEST_TIMEOUT_S)]

    result = fuzz_schema(schemathesis.openapi.from_dict(MESSAGES_ROUTES_SCHEMA), SCHEMA_CASES_PER_OPERATION, send)
    with capsys.disabled():
        print("\n" + result.figures("messages and embeddings routes"))
    assert result.server_errors == [], result.server_errors
    assert result.statuses[200] > 0, "no case fit the schema and was answered"
