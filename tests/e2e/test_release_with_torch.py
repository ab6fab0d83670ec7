"""Releases over real weights: two tiny torch checkpoints saved with the DCP writer, served by two
reference servers; promote, roll back while a stream is in flight, and refuse a corrupted checkpoint.

Needs torch (the `train` extra); skipped without it.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

# Looked up, not imported: torch takes seconds to import, in every process that collects the tests.
if importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch (pip install 'agent-gateway[train]')", allow_module_level=True)

from checkpoints.registry import CheckpointRegistry, ProblemKind
from checkpoints.training import save_checkpoint
from common.processes import Announced, start_announcing
from testkit.procs import Gateway, deployment, running_gateway

MODEL = "tiny"
QUESTION = "which release answers?"
PROMPTS = {"v1": "A:", "v2": "Z:"}
STREAM_TOKENS = 120  # 20 ms a character: a stream of about 2.4 s
ANSWER_TOKENS = 24

# Without an initialized process group the DCP writer warns that it assumes a single process: it is one.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two versions of one run, trained on different text, saved with torch DCP and registered."""
    from tests.support import charlm  # imports torch: only when this test runs

    root = tmp_path_factory.mktemp("torch-release")
    registry = CheckpointRegistry(root / "registry")
    started = time.monotonic()
    states = {
        10: charlm.train("A: the answer is aaaa aaaa. " * 40, steps=60, seed=1),
        20: charlm.train("Z: zzzz zzzz zz zzzz. " * 40, steps=60, seed=2),
    }
    trained_s = time.monotonic() - started
    paths = {}
    for step, state in states.items():
        saved = save_checkpoint(state, root / "ckpt", "tiny", step, registry=registry).result(timeout=60)
        assert saved.version == f"tiny@{step}"
        assert saved.entry is not None
        assert saved.entry.format == "torch-dcp"
        paths[step] = saved.path
    saved_s = time.monotonic() - started - trained_s
    servers: list[Announced] = []
    try:
        for step in (10, 20):
            args = ["tests.support.refserver", "--checkpoint", str(paths[step]), "--port", "0"]
            servers.append(start_announcing(args, timeout_s=60))
        print(f"\ntrain {trained_s:.2f}s, save {saved_s:.2f}s, refservers up {time.monotonic() - started:.2f}s")
        yield {"registry": registry, "paths": {"v1": paths[10], "v2": paths[20]}, "refs": servers}
    finally:
        for server in servers:
            server.stop()


def direct(ref: Announced, system_prompt: str, max_tokens: int) -> str:
    """What a reference server answers when called directly with this prompt."""
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": QUESTION}]
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
    reply = httpx.post(f"{ref.url}/v1/chat/completions", json=body, timeout=30)
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"])


def answer(gateway: Gateway, max_tokens: int = ANSWER_TOKENS) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": max_tokens}
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=30)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def admin(gateway: Gateway, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/admin/models/{MODEL}/{path}",
        json=body or {},
        headers=gateway.headers(gateway.admin_key),
        timeout=60,
    )


def active(gateway: Gateway) -> str | None:
    overview = httpx.get(
        f"{gateway.url}/admin/models/{MODEL}/releases", headers=gateway.headers(gateway.admin_key), timeout=10
    )
    overview.raise_for_status()
    active: str | None = overview.json()["active"]
    return active


@pytest.fixture
def gateway(weights: dict[str, Any], tmp_path: Path) -> Iterator[Gateway]:
    """One gateway (embedded store) with v1 (ref-1, tiny@10, "A:") and v2 (ref-2, tiny@20, "Z:")."""
    ref1, ref2 = weights["refs"]
    config = {
        "routing": {"retry": {"backoff_base_s": 0.01}, "health": {"interval_s": 30}},
        "models": [
            {
                "name": MODEL,
                "deployments": [
                    deployment("ref-1", ref1, model=MODEL),
                    deployment("ref-2", ref2, model=MODEL, priority=1),
                ],
            }
        ],
        "releases": {"checkpoint_registry": str(weights["registry"].root), "watch_interval_s": 0.1},
    }
    with ExitStack() as stack:
        gw = stack.enter_context(running_gateway(tmp_path, config))
        specs = [
            {
                "version": "v1",
                "deployments": ["ref-1"],
                "checkpoint": "tiny@10",
                "system_prompt": PROMPTS["v1"],
                "prompt_version": "p1",
            },
            {
                "version": "v2",
                "deployments": ["ref-2"],
                "checkpoint": "tiny@20",
                "system_prompt": PROMPTS["v2"],
                "prompt_version": "p2",
            },
        ]
        for spec in specs:
            created = admin(gw, "releases", spec)
            assert created.status_code == 201, created.text
        yield gw


def test_rollback_while_a_stream_is_in_flight(weights: dict[str, Any], gateway: Gateway) -> None:
    ref1, ref2 = weights["refs"]
    expected_v1 = direct(ref1, PROMPTS["v1"], ANSWER_TOKENS)
    expected_v2_stream = direct(ref2, PROMPTS["v2"], STREAM_TOKENS)
    assert expected_v1 != expected_v2_stream[:ANSWER_TOKENS], "v1 and v2 weights must answer differently"

    assert admin(gateway, "promote", {"version": "v1"}).json()["active"] == "v1"
    assert answer(gateway) == expected_v1
    promoted = admin(gateway, "promote", {"version": "v2", "reason": "new checkpoint"})
    assert promoted.status_code == 200, promoted.text
    assert answer(gateway) == direct(ref2, PROMPTS["v2"], ANSWER_TOKENS)

    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": STREAM_TOKENS,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    text, chunks_before, chunks_after, done = "", 0, 0, False
    rolled: httpx.Response | None = None
    started = time.monotonic()
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=30
    ) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                break
            event = orjson.loads(data)
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content") or ""
                if content:
                    text += content
                    if rolled is None:
                        chunks_before += 1
                    else:
                        chunks_after += 1
            if rolled is None and chunks_before >= 5:
                rollback_started = time.monotonic()
                rolled = admin(gateway, "rollback", {"reason": "regression seen mid-stream"})
                rollback_s = time.monotonic() - rollback_started
    stream_s = time.monotonic() - started
    assert rolled is not None, "the stream ended before the rollback was made"
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["active"] == "v1"
    assert rolled.json()["changed"] is True
    assert rolled.json()["post_check"] == "ok"
    assert chunks_after > 0, "the stream was over before the rollback: nothing was in flight"
    assert done, "the in-flight stream did not end with [DONE]"
    assert text == expected_v2_stream, "the in-flight stream must finish on v2 (its weights and prompt)"

    assert active(gateway) == "v1"
    assert answer(gateway) == expected_v1, "a new request after the rollback is served by v1 with v1's prompt"
    print(
        f"\nstream {stream_s:.2f}s ({chunks_before} chunks before the rollback, {chunks_after} after), "
        f"rollback call {rollback_s * 1000:.0f} ms"
    )


def test_a_flipped_byte_in_the_weights_blocks_promote_and_rollback(weights: dict[str, Any], gateway: Gateway) -> None:
    ref1 = weights["refs"][0]
    registry: CheckpointRegistry = weights["registry"]
    assert registry.verify("tiny@20").ok
    assert admin(gateway, "promote", {"version": "v1"}).status_code == 200
    shard = sorted(weights["paths"]["v2"].glob("*.distcp"))[0]
    good = shard.read_bytes()
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0x01
    shard.write_bytes(bytes(flipped))
    try:
        report = registry.verify("tiny@20")
        assert [(p.kind, p.file) for p in report.problems] == [(ProblemKind.CHANGED, shard.name)]
        assert registry.verify("tiny@10").ok

        refused = admin(gateway, "promote", {"version": "v2"})
        assert refused.status_code == 409, refused.text
        message = refused.json()["error"]["message"]
        assert f"changed: {shard.name}" in message
        assert "tiny@20" in message
        assert active(gateway) == "v1"

        refused = admin(gateway, "rollback", {"version": "v2", "reason": "to the broken one"})
        assert refused.status_code == 409, refused.text
        assert f"changed: {shard.name}" in refused.json()["error"]["message"]
        assert active(gateway) == "v1"
        assert answer(gateway) == direct(ref1, PROMPTS["v1"], ANSWER_TOKENS)
    finally:
        shard.write_bytes(good)
    assert registry.verify("tiny@20").ok
