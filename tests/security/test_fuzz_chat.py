"""Property-based fuzzing of POST /v1/chat/completions against a served gateway: bodies, raw
bytes, headers, nesting, sizes, unicode and numbers. No answer is a 5xx or an in-band internal
error, none hangs past a bound; afterwards the audit chain verifies (`gateway audit verify`) and
no quota lease is left behind. The figures (cases, 5xx) are printed and recorded as properties."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.security.helpers import CHAT, SECURITY_POLICY, chat
from tests.security.strategies import HEADER_TEXT, REQUEST_BODY

CASES = 200
REQUEST_TIMEOUT_S = 30.0  # "no hang": every answer, streamed ones whole, within this
CONCURRENCY = 2  # the fuzzed key's concurrency limit: a leaked lease shows up as a 429 at the end


@pytest.fixture(scope="module")
def fuzzed(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("fuzz-chat")
    config = gateway_config(
        deployment("a", sim_pair[0]),
        tools={"policy_file": policy_file(path, SECURITY_POLICY)},
        audit={"refusal_interval_s": 1.0},
    )
    with running_gateway(path, config) as running:
        _, running.key = running.create_key(max_concurrency=CONCURRENCY, rpm=100_000)
        yield running


def _auth(gateway: Gateway) -> st.SearchStrategy[dict[str, str]]:
    valid = {"Authorization": f"Bearer {gateway.key}"}
    return st.sampled_from(
        [
            *[valid] * 9,
            {},
            {"Authorization": "Bearer agw_" + "A" * 43},
            {"Authorization": "Basic x"},
        ]
    )


EXTRA_HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "X-Request-Id": HEADER_TEXT,
        "X-Session-Id": HEADER_TEXT | st.sampled_from([b"s1", b"s2"]),
        "X-Session-Append": st.sampled_from([b"true", b"false"]) | HEADER_TEXT,
        "X-Approval-Id": HEADER_TEXT,
        "Content-Type": st.sampled_from([b"application/json", b"text/plain"]) | HEADER_TEXT,
    },
)


def _payload(body: Any) -> bytes:
    # json.dumps, not orjson: NaN, Infinity and lone surrogates must reach the gateway as they are.
    return json.dumps(body).encode("utf-8", "surrogatepass")


class Tally:
    def __init__(self) -> None:
        self.cases = 0
        self.server_errors: list[str] = []
        self.statuses: Counter[int] = Counter()

    def check(self, reply: httpx.Response, what: str) -> None:
        self.cases += 1
        self.statuses[reply.status_code] += 1
        if reply.status_code >= 500 or b'"code":"internal_error"' in reply.content:
            self.server_errors.append(f"{reply.status_code} for {what[:300]}: {reply.text[:300]}")


def _send(gateway: Gateway, headers: dict[str, Any], content: bytes) -> httpx.Response:
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        return client.post(f"{gateway.url}/v1/chat/completions", content=content, headers=headers)


def _run(test: Callable[[], None]) -> None:
    settings(
        max_examples=CASES,
        deadline=None,
        derandomize=True,  # the same cases on every run: a CI failure reproduces
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )(test)()


def test_fuzz_chat_completions_never_5xx(
    fuzzed: Gateway, record_property: Callable[[str, Any], None], capsys: pytest.CaptureFixture[str]
) -> None:
    tally = Tally()

    @given(
        auth=_auth(fuzzed),
        extra=st.one_of(st.just({}), st.just({}), EXTRA_HEADERS),
        body=REQUEST_BODY | st.binary(max_size=300).map(lambda raw: ("raw", raw)),
    )
    def case(auth: dict[str, str], extra: dict[str, bytes], body: Any) -> None:
        content = body[1] if isinstance(body, tuple) else _payload(body)
        headers = {"Content-Type": "application/json", **extra, **auth}
        tally.check(_send(fuzzed, headers, content), f"{headers} {content[:300]!r}")

    run_and_report(case, tally, "chat", fuzzed, record_property, capsys)


def run_and_report(
    case: Callable[[], None],
    tally: Tally,
    name: str,
    gateway: Gateway,
    record_property: Callable[[str, Any], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run the fuzzed `case`, print and record its figures, and check that no case was a 5xx and
    that the gateway is consistent afterwards."""
    try:
        _run(case)
    finally:
        with capsys.disabled():  # the figures show in every run, not only with -s
            print(
                f"\nfuzz {name}: {tally.cases} cases, {len(tally.server_errors)} 5xx, statuses {dict(tally.statuses)}"
            )
        record_property(f"fuzz_{name}_cases", tally.cases)
        record_property(f"fuzz_{name}_5xx", len(tally.server_errors))
    assert tally.server_errors == []
    assert tally.cases >= CASES // 2
    _assert_consistent_afterwards(gateway)


def _assert_consistent_afterwards(gateway: Gateway) -> None:
    verified = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "verify", "--config", str(gateway.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    assert "ok" in verified.stdout
    # Every concurrency slot of the fuzzed key is free again: as many requests as it may run at
    # once are all admitted, together.
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        replies = list(pool.map(lambda _: chat(gateway, {**CHAT, "max_tokens": 8}), range(CONCURRENCY)))
    assert [r.status_code for r in replies] == [200] * CONCURRENCY, [r.text for r in replies]
