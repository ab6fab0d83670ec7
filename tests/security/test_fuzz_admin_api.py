"""Schemathesis against the admin API, from the gateway's own OpenAPI schema: for every operation,
cases that fit the schema and cases that break it, sent with the bootstrap admin key and without a
key. No answer is a 5xx. The figures (operations, cases, 5xx) are printed and recorded."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.security.helpers import SECURITY_POLICY
from tests.security.schema_fuzz import fuzz_schema

CASES_PER_OPERATION = 12  # per generation mode
REQUEST_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def admin_target(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("fuzz-admin")
    config = gateway_config(deployment("a", sim_pair[0]), tools={"policy_file": policy_file(path, SECURITY_POLICY)})
    with running_gateway(path, config) as running:
        yield running


def _schema(gateway: Gateway) -> Any:
    reply = httpx.get(f"{gateway.url}/openapi.json", headers=gateway.headers(gateway.admin_key), timeout=30)
    reply.raise_for_status()
    return schemathesis.openapi.from_dict(reply.json())


def test_fuzz_admin_api_never_5xx(
    admin_target: Gateway, record_property: Callable[[str, Any], None], capsys: pytest.CaptureFixture[str]
) -> None:
    keys = [admin_target.headers(admin_target.admin_key), {}]

    def send(case: Any) -> list[Any]:
        return [case.call(base_url=admin_target.url, headers=headers, timeout=REQUEST_TIMEOUT_S) for headers in keys]

    fuzzed = fuzz_schema(_schema(admin_target), CASES_PER_OPERATION, send)
    assert fuzzed.operations, "the schema lists no operations"
    with capsys.disabled():  # the figures show in every run, not only with -s
        print(print(f"\nfuzz admin API: {len(fuzzed.server_errors)} 5xx; " + fuzzed.figures("admin API")))
    record_property("fuzz_admin_cases", fuzzed.cases)
    record_property("fuzz_admin_5xx", len(fuzzed.server_errors))
    assert fuzzed.server_errors == [], fuzzed.server_errors
