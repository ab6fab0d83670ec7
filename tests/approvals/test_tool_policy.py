"""The tool-policy stage on the response side, over a scripted upstream: what the model returns
is judged call by call, and nothing of a denied call reaches the client."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from gateway.approvals.service import ApprovalService
from gateway.approvals.tool_policy import PolicyHolder, ToolPolicy
from gateway.audit.writer import AuditWriter, iterate
from gateway.core.chunks import Chunk, ToolCallDelta
from gateway.core.principal import Limits, Principal
from gateway.pipeline import Call, RequestContext, compose
from gateway.routing.deployment import Deployment
from gateway.routing.router import ModelGroup, Router
from gateway.routing.strategies import STRATEGIES
from gateway.settings import DeploymentSettings, EmbeddedStoreSettings, RoutingSettings, Strategy
from gateway.store.embedded import EmbeddedStore
from gateway.surfaces.chat_completions import ChatCompletions
from tests.doubles import Script, ScriptedBackend

POLICY = """
policies:
  agent:
    tools:
      - {name: get_weather, risk: low}
      - name: lookup_order
        risk: low
        arguments: {type: object, properties: {order_id: {type: string, pattern: "^ord_[0-9]+$"}}, required: [order_id]}
bindings:
  tenants: {acme: agent}
"""
PRINCIPAL = Principal("key_test", "acme", frozenset({"chat"}), frozenset(), Limits())


def split(index: int, call_id: str, name: str, arguments: str, pieces: int) -> list[Chunk]:
    """One tool call streamed as many small deltas, the way real servers send them."""
    step = max(1, len(arguments) // pieces)
    fragments = [arguments[i : i + step] for i in range(0, len(arguments), step)] or [""]
    first = Chunk(tool_calls=[ToolCallDelta(index, call_id, name, fragments[0])])
    return [first, *(Chunk(tool_calls=[ToolCallDelta(index, None, None, f)]) for f in fragments[1:])]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    opened = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    yield opened
    await opened.aclose()


async def run(
    store: EmbeddedStore, tmp_path: Path, prelude: list[Chunk]
) -> tuple[list[Chunk], list[dict[str, object]]]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    backend = ScriptedBackend("up", Script(tokens=[]))
    backend.prelude = prelude
    routing = RoutingSettings()
    deployment = Deployment(
        DeploymentSettings(name="up", api_base="http://127.0.0.1:1/v1", model="m"), backend, routing
    )
    router = Router(
        {"m": ModelGroup("m", [deployment], STRATEGIES[Strategy.PRIORITY], routing)}, routing, rng=random.Random(1)
    )
    audit = AuditWriter(store, queue_size=100, batch_size=100, flush_interval_s=0.01)
    approvals = ApprovalService(store, audit, b"s" * 32)
    stage = ToolPolicy(PolicyHolder(tmp_path / "policy.yaml"), approvals, audit, poll_s=0.01)
    handler = compose([stage], Call(router))
    ctx = RequestContext(
        "r1", "c1", ChatCompletions(), model="m", body={"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    ctx.principal = PRINCIPAL
    chunks = [c async for c in handler(ctx)]
    await audit.flush()
    return chunks, [r.to_dict() async for r in iterate(store) if r.body["kind"] == "policy"]


def calls(chunks: list[Chunk]) -> list[ToolCallDelta]:
    return [t for c in chunks for t in c.tool_calls]


def text(chunks: list[Chunk]) -> str:
    return "".join(c.content or "" for c in chunks)


async def test_call_split_across_many_chunks_is_judged_whole_and_sent_whole(
    store: EmbeddedStore, tmp_path: Path
) -> None:
    chunks, decisions = await run(store, tmp_path, split(0, "c1", "get_weather", '{"city": "Reykjavik"}', pieces=12))
    [call] = calls(chunks)
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Reykjavik"}')
    assert [d["decision"] for d in decisions] == ["allow"]


@pytest.mark.parametrize(
    "name", ["get_weathe", "Get_Weather", "get_weather; rm -rf /", "delete_everything", "get_weather\u200b"]
)
async def test_hallucinated_or_injected_name_is_removed(store: EmbeddedStore, tmp_path: Path, name: str) -> None:
    chunks, decisions = await run(store, tmp_path, split(0, "c1", name, '{"city": "x"}', pieces=3))
    assert calls(chunks) == []
    assert "blocked" in text(chunks)
    assert decisions[0]["code"] == "unknown_tool"


async def test_malformed_arguments_are_removed(store: EmbeddedStore, tmp_path: Path) -> None:
    chunks, decisions = await run(store, tmp_path, split(0, "c1", "get_weather", '{"city": "Oslo"', pieces=4))
    assert calls(chunks) == []
    assert decisions[0]["code"] == "malformed_arguments"


async def test_parallel_calls_with_one_denied_keep_the_others(store: EmbeddedStore, tmp_path: Path) -> None:
    prelude = [
        *split(0, "c1", "get_weather", '{"city": "Oslo"}', pieces=3),
        *split(1, "c2", "lookup_order", '{"order_id": "DROP TABLE"}', pieces=3),
        *split(2, "c3", "lookup_order", '{"order_id": "ord_42"}', pieces=3),
    ]
    chunks, decisions = await run(store, tmp_path, prelude)
    assert [(c.id, c.name) for c in calls(chunks)] == [("c1", "get_weather"), ("c3", "lookup_order")]
    assert "order_id" in text(chunks)
    assert [d["decision"] for d in decisions] == ["allow", "deny", "allow"]


async def test_turn_with_every_call_denied_ends_as_stop(store: EmbeddedStore, tmp_path: Path) -> None:
    prelude = [*split(0, "c1", "nope", "{}", 1), Chunk(finish_reason="tool_calls")]
    chunks, _ = await run(store, tmp_path, prelude)
    assert next(c.finish_reason for c in chunks if c.finish_reason) == "stop"


async def test_stripped_tools_are_logged_at_debug_and_named_in_a_header(
    store: EmbeddedStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    audit = AuditWriter(store, queue_size=100, batch_size=100, flush_interval_s=0.01)
    stage = ToolPolicy(PolicyHolder(tmp_path / "policy.yaml"), ApprovalService(store, audit, b"s" * 32), audit, 0.01)
    tools = [{"type": "function", "function": {"name": n}} for n in ("get_weather", "rm\r\nX-Evil: 1")]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools}
    ctx = RequestContext("r1", "c1", ChatCompletions(), model="m", body=body)
    ctx.principal = PRINCIPAL

    async def upstream(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
        yield Chunk(content="ok", finish_reason="stop")

    with caplog.at_level(logging.DEBUG, logger="gateway.tool_policy"):
        assert [c.content async for c in stage(ctx, upstream)] == ["ok"]
    assert ctx.body["tools"] == tools[:1]
    assert ctx.response_headers["X-Tools-Removed"] == "rm??X-Evil: 1"  # no header injection
    [record] = [r for r in caplog.records if "removed" in r.getMessage()]
    assert record.levelno == logging.DEBUG
    assert "rm\r\nX-Evil: 1" in record.getMessage()
