"""Issue 11, Info: approval tokens were not bound to the key and tenant that requested them, so a
token seen by another key (a shared transcript, a log) vouched for that key's tool results too.
Tokens now carry the requester's key id and tenant; the gateway accepts a tool result only with a
token of the calling key, and a tool server can check the same with `verify_approval_token`."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from gateway.approvals.service import ApprovalService
from gateway.approvals.tool_policy import PolicyHolder, ToolPolicy
from gateway.audit.writer import AuditWriter
from gateway.core.principal import Limits, Principal
from gateway.errors import InvalidRequest
from gateway.pipeline import Call, RequestContext, compose
from gateway.routing.deployment import Deployment
from gateway.routing.router import ModelGroup, Router
from gateway.routing.strategies import STRATEGIES
from gateway.settings import DeploymentSettings, EmbeddedStoreSettings, RoutingSettings, Strategy
from gateway.store.embedded import EmbeddedStore
from gateway.surfaces.chat_completions import ChatCompletions
from policies import InvalidApprovalToken, arguments_sha256, issue_approval_token, verify_approval_token
from tests.doubles import Script, ScriptedBackend

SECRET = b"s" * 32
ARGS = '{"amount": 5}'
POLICY = """
policies:
  agent:
    approval: {mode: defer}
    tools:
      - {name: refund, risk: high, arguments: {type: object, properties: {amount: {type: integer}}}}
bindings:
  tenants: {acme: agent, globex: agent}
"""


def token(key_id: str, tenant: str) -> str:
    return issue_approval_token(SECRET, "apr_1", "refund", arguments_sha256(ARGS), 4e9, key_id=key_id, tenant=tenant)


def test_token_names_its_requester_and_verifies_only_for_it() -> None:
    issued = token("key_a", "acme")
    claims = verify_approval_token(issued, SECRET, "refund", ARGS, key_id="key_a", tenant="acme")
    assert (claims.key_id, claims.tenant) == ("key_a", "acme")
    for key_id, tenant in (("key_b", "acme"), ("key_a", "globex")):
        with pytest.raises(InvalidApprovalToken) as refused:
            verify_approval_token(issued, SECRET, "refund", ARGS, key_id=key_id, tenant=tenant)
        assert refused.value.code == "wrong_requester"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    opened = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    yield opened
    await opened.aclose()


async def send_tool_result(store: EmbeddedStore, tmp_path: Path, caller: Principal, approval_token: str) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    routing = RoutingSettings()
    backend = ScriptedBackend("up", Script(tokens=["ok"]))
    deployment = Deployment(
        DeploymentSettings(name="up", api_base="http://127.0.0.1:1/v1", model="m"), backend, routing
    )
    router = Router(
        {"m": ModelGroup("m", [deployment], STRATEGIES[Strategy.PRIORITY], routing)}, routing, rng=random.Random(1)
    )
    audit = AuditWriter(store, queue_size=100, batch_size=100, flush_interval_s=0.01)
    stage = ToolPolicy(PolicyHolder(tmp_path / "policy.yaml"), ApprovalService(store, audit, SECRET), audit, 0.01)
    call = {"id": "c1", "type": "function", "function": {"name": "refund", "arguments": ARGS}}
    messages = [
        {"role": "user", "content": "refund me"},
        {"role": "assistant", "tool_calls": [{**call, "approval_token": approval_token}]},
        {"role": "tool", "tool_call_id": "c1", "content": orjson.dumps({"refunded": 5}).decode()},
    ]
    ctx = RequestContext("r1", "c1", ChatCompletions(), model="m", body={"model": "m", "messages": messages})
    ctx.principal = caller
    [_ async for _ in compose([stage], Call(router))(ctx)]


def principal(key_id: str, tenant: str) -> Principal:
    return Principal(key_id, tenant, frozenset({"chat"}), frozenset(), Limits())


async def test_gateway_accepts_a_tool_result_only_with_the_callers_own_token(
    store: EmbeddedStore, tmp_path: Path
) -> None:
    await send_tool_result(store, tmp_path, principal("key_a", "acme"), token("key_a", "acme"))
    for thief in (principal("key_b", "acme"), principal("key_a", "globex")):
        with pytest.raises(InvalidRequest, match="does not check out"):
            await send_tool_result(store, tmp_path, thief, token("key_a", "acme"))
