"""Property-based fuzzing of POST /v1/messages and /v1/messages/count_tokens against a served
gateway (issue 32): no answer is a 5xx or an in-band internal error, none hangs past a bound, and
afterwards the audit chain verifies and no quota lease is left behind (test_fuzz_chat.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.security.helpers import SECURITY_POLICY
from tests.security.messages_strategies import MESSAGES_BODY
from tests.security.test_fuzz_chat import CONCURRENCY, REQUEST_TIMEOUT_S, Tally, run_and_report


@pytest.fixture(scope="module")
def fuzzed(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("fuzz-messages")
    config = gateway_config(deployment("a", sim_pair[0]), tools={"policy_file": policy_file(path, SECURITY_POLICY)})
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
