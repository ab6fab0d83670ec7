"""Replay of Responses and Messages API samples (issues 31, 32): a sample whose body has `input`
and no `messages` goes to `/v1/responses`, one marked `"api": "messages"` (or a Batch line for
`/v1/messages`) to `/v1/messages`, and their streams' typed events give TTFT, TPOT and the output
tokens (from the usage they end with) as a chat stream's chunks do; failures keep their reasons.
Against a real gateway process in front of the simulated backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.processes import Announced
from replay.client import ClientConfig
from replay.runner import LoadPlan
from replay.samples import MESSAGES, RESPONSES, Overrides, load_samples
from replay.session import RunOptions, replay, run_blocking
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.replay.conftest import SHARED_SAMPLES, chat_body, write_jsonl

TOKENS = 8


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("replay-responses")
    with running_gateway(path, gateway_config(deployment("a", sim_pair[0]))) as running:
        yield running


def samples(path: Path) -> Path:
    lines: list[dict[str, Any]] = [
        {"id": "r-text", "model": "sim-model", "input": "Tell me story 1.", "stream": True},
        {
            "id": "r-items",
            "model": "sim-model",
            "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Tell me story 2."}]}],
            "stream": True,
        },
        {"id": "r-whole", "model": "sim-model", "input": "Tell me story 3."},
        {"id": "c-chat", **chat_body(4, stream=True)},
        {
            "custom_id": "r-batch",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "sim-model", "input": "Tell me story 5.", "stream": True},
        },
        {"id": "r-gone", "model": "sim-model", "input": "Go on.", "previous_response_id": "resp_missing"},
        {
            "id": "m-stream",
            "api": "messages",
            "model": "sim-model",
            "max_tokens": 50,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me story 6."}]}],
            "stream": True,
        },
        {
            "custom_id": "m-whole",
            "url": "/v1/messages",
            "body": {"model": "sim-model", "max_tokens": 50, "messages": [{"role": "user", "content": "Story 7."}]},
        },
    ]
    return write_jsonl(path, lines)


def test_responses_samples_are_sent_to_their_api_and_timed_like_chat_ones(gateway: Gateway, tmp_path: Path) -> None:
    path = samples(tmp_path / "responses.jsonl")
    apis = [s.api for s in load_samples(path).samples]
    assert (apis.count(RESPONSES), apis.count(MESSAGES)) == (5, 2)
    config = ClientConfig(f"{gateway.url}/v1", api_key=gateway.key)
    options = RunOptions(path, config, LoadPlan(concurrency=2, count=8), Overrides(max_tokens=TOKENS))
    document = run_blocking(replay(options))
    records = {record["sample_id"]: record for record in document["records"]}
    for streamed in ("r-text", "r-items", "c-chat", "r-batch", "m-stream"):
        record = records[streamed]
        assert record["ok"], record
        assert (record["output_tokens"], record["tokens_source"]) == (TOKENS, "usage")
        assert record["finish_reason"] == "length"  # --max-tokens: the cap is what was asked
        assert 0 < record["ttft_s"] <= record["e2e_s"]
        assert record["tpot_s"] is not None  # 0 when the sim's few tokens came in one read
    assert records["r-whole"]["ok"], records["r-whole"]
    assert records["r-whole"]["ttft_s"] == records["r-whole"]["e2e_s"]
    assert records["r-whole"]["output_tokens"] == TOKENS
    assert (records["r-gone"]["ok"], records["r-gone"]["reason"]) == (False, "http_404")
    assert records["m-whole"]["ok"], records["m-whole"]
    assert (records["m-whole"]["output_tokens"], records["m-whole"]["finish_reason"]) == (TOKENS, "length")


def _every_tool_allowed(path: Path, samples_file: Path) -> str:
    """A tool policy that whitelists every tool the samples offer (the gateway denies by default)."""
    names: set[str] = set()
    for line in samples_file.read_text().splitlines():
        for tool in orjson.loads(line)["body"].get("tools", ()):
            names.add(tool.get("name") or tool["function"]["name"])
    listed = "\n".join(f"      - {{name: {name}, risk: low}}" for name in sorted(names))
    return policy_file(path, f"policies:\n  agent:\n    tools:\n{listed}\nbindings:\n  tenants: {{acme: agent}}\n")


@pytest.mark.skipif(not (SHARED_SAMPLES / "bfcl_live_responses.jsonl").exists(), reason="../shared/samples is absent")
@pytest.mark.parametrize("name", ["bfcl_live_responses.jsonl", "bfcl_live_messages.jsonl"])
def test_the_shared_samples_replay_on_their_own_api_with_valid_tool_calls(
    sim_pair: list[Announced], tmp_path: Path, name: str
) -> None:
    samples_file = SHARED_SAMPLES / name
    policy = _every_tool_allowed(tmp_path, samples_file)
    config = gateway_config(deployment("a", sim_pair[0]), tools={"policy_file": policy})
    with running_gateway(tmp_path, config) as served:
        client = ClientConfig(f"{served.url}/v1", api_key=served.key)
        options = RunOptions(samples_file, client, LoadPlan(concurrency=16, count=0), Overrides(model="sim-model"))
        document = run_blocking(replay(options))
    summary = document["summary"]
    assert (summary["requests"], summary["succeeded"]) == (240, 240), summary["failures"]
    assert summary["finish_reasons"] == {"tool_calls": 240}  # the sim calls a tool it is offered
    assert {record["ttft_s"] is not None for record in document["records"]} == {True}
