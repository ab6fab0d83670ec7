"""Schemathesis against the admin API, from the gateway's own OpenAPI schema: for every operation,
cases that fit the schema and cases that break it, sent with the bootstrap admin key and without a
key. No answer is a 5xx. The figures (operations, cases, 5xx) are printed and recorded."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.security.helpers import SECURITY_POLICY

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
    schema = _schema(admin_target)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, "the schema lists no operations"
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    keys = [admin_target.headers(admin_target.admin_key), {}]

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=CASES_PER_OPERATION,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                for headers in keys:
                    response = case.call(base_url=admin_target.url, headers=headers, timeout=REQUEST_TIMEOUT_S)
                    statuses[response.status_code] += 1
                    if response.status_code >= 500:
                        server_errors.append(f"{case.method} {case.formatted_path}: {response.text[:300]}")

            try:
                run()
            except Exception as error:  # schemathesis cannot build cases for this operation and mode
                if "Unsatisfiable" not in type(error).__name__:
                    raise
    cases = sum(statuses.values())
    with capsys.disabled():  # the figures show in every run, not only with -s
        print(
            f"\nfuzz admin API: {len(operations)} operations, {cases} cases, {len(server_errors)} 5xx, {dict(statuses)}"
        )
    record_property("fuzz_admin_cases", cases)
    record_property("fuzz_admin_5xx", len(server_errors))
    assert server_errors == [], server_errors
    verdict = httpx.get(
        f"{admin_target.url}/admin/audit/verify", headers=admin_target.headers(admin_target.admin_key), timeout=60
    ).json()
    assert verdict["ok"], verdict
