"""Property-based fuzzing of POST /v1/responses against a served gateway (issue 31): no answer is
a 5xx or an in-band internal error, none hangs past a bound, and afterwards the audit chain
verifies and no quota lease is left behind, as for the chat endpoint (test_fuzz_chat.py)."""

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
from tests.security.responses_strategies import RESPONSES_BODY
from tests.security.schema_fuzz import fuzz_schema
from tests.security.test_fuzz_chat import CONCURRENCY, REQUEST_TIMEOUT_S, Tally, run_and_report


@pytest.fixture(scope="module")
def fuzzed(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("fuzz-responses")
    config = gateway_config(deployment("a", sim_pair[0]), tools={"policy_file": policy_file(path, SECURITY_POLICY)})
    with running_gateway(path, config) as running:
        _, running.key = running.create_key(max_concurrency=CONCURRENCY, rpm=100_000)
        yield running


def test_fuzz_responses_never_5xx(
    fuzzed: Gateway, record_property: Callable[[str, Any], None], capsys: pytest.CaptureFixture[str]
) -> None:
    tally = Tally()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {fuzzed.key}"}

    @given(body=RESPONSES_BODY | st.binary(max_size=300).map(lambda raw: ("raw", raw)))
    def case(body: Any) -> None:
        # json.dumps, not orjson: NaN, Infinity and lone surrogates must reach the gateway as they are.
        content = body[1] if isinstance(body, tuple) else json.dumps(body).encode("utf-8", "surrogatepass")
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            reply = client.post(f"{fuzzed.url}/v1/responses", content=content, headers=headers)
        tally.check(reply, repr(content[:300]))

    run_and_report(case, tally, "responses", fuzzed, record_property, capsys)


# The Responses routes are not FastAPI operations (they are the OpenAI API, served as Starlette
# routes), so their schema is written here: the subset of OpenAI's documented parameters the
# gateway serves, for schemathesis to make cases that fit it and cases that break it.
_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
_ANSWERS = {"responses": {"default": {"description": "any"}}}
RESPONSES_ROUTES_SCHEMA: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Responses routes", "version": "1"},
    "paths": {
        "/v1/responses": {
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["model", "input"],
                                "properties": {
                                    "model": {"type": "string", "enum": ["sim-model"]},
                                    "input": {"type": "string", "maxLength": 40},
                                    "store": {"type": "boolean"},
                                    "background": {"type": "boolean"},
                                    "stream": {"type": "boolean"},
                                    "previous_response_id": {"type": "string"},
                                    "instructions": {"type": "string", "maxLength": 40},
                                },
                                "additionalProperties": False,
                            }
                        }
                    },
                },
                **_ANSWERS,
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "parameters": [
                    _RESPONSE_ID,
                    {"name": "stream", "in": "query", "schema": {"type": "boolean"}},
                    {"name": "starting_after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                ],
                **_ANSWERS,
            },
            "delete": {"parameters": [_RESPONSE_ID], **_ANSWERS},
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "parameters": [
                    _RESPONSE_ID,
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                    {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                    {"name": "before", "in": "query", "schema": {"type": "string"}},
                ],
                **_ANSWERS,
            }
        },
        "/v1/responses/{response_id}/cancel": {"post": {"parameters": [_RESPONSE_ID], **_ANSWERS}},
    },
}
SCHEMA_CASES_PER_OPERATION = 12  # per generation mode


def test_schemathesis_on_the_responses_routes_finds_no_5xx(
    fuzzed: Gateway, capsys: pytest.CaptureFixture[str], record_property: Callable[[str, Any], None]
) -> None:
    kept = httpx.post(
        f"{fuzzed.url}/v1/responses",
        json={"model": "sim-model", "input": "a kept one"},
        headers=fuzzed.headers(),
        timeout=REQUEST_TIMEOUT_S,
    ).json()

    def send(case: Any) -> list[Any]:
        answers = [case.call(base_url=fuzzed.url, headers=fuzzed.headers(), timeout=REQUEST_TIMEOUT_S)]
        if case.path_parameters and "response_id" in case.path_parameters:
            case.path_parameters["response_id"] = kept["id"]  # and for a response that exists
            answers.append(case.call(base_url=fuzzed.url, headers=fuzzed.headers(), timeout=REQUEST_TIMEOUT_S))
        return answers

    result = fuzz_schema(schemathesis.openapi.from_dict(RESPONSES_ROUTES_SCHEMA), SCHEMA_CASES_PER_OPERATION, send)
    with capsys.disabled():
        print("\n" + result.figures("responses routes"))
    record_property("fuzz_responses_routes_cases", result.cases)
    assert result.server_errors == [], result.server_errors
