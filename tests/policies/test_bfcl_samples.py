"""The engine against real agent requests: the BFCL live samples kept beside the repository."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from policies import Allow, Deny, PolicyEngine, parse_policy_file

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "samples"
REQUESTS = SAMPLES / "bfcl_live_requests.jsonl"
SESSIONS = SAMPLES / "bfcl_multiturn_sessions.jsonl"


def _value_for(schema: dict[str, Any]) -> Any:
    """A value satisfying `schema` as far as the keywords BFCL uses go (type, enum, required, items)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: _value_for(properties.get(name, {})) for name in schema.get("required", [])}
    if kind == "array":
        items = schema.get("items")
        return [_value_for(items)] if isinstance(items, dict) else []
    if kind is None:
        return "any value"  # BFCL's `any`: the converter left no type
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "null": None}[kind]


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        pytest.skip(f"BFCL samples not found at {path} (they live in ../shared/samples beside the repository)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _policy_file_allowing_first_tools(requests: list[dict[str, Any]]) -> dict[str, Any]:
    # One policy per request, bound to a tenant of the same name: two requests may define
    # different tools under one name, which a single policy could not hold.
    policies: dict[str, Any] = {}
    for request in requests:
        function = request["body"]["tools"][0]["function"]
        rule = {"name": function["name"], "risk": "low", "arguments": function["parameters"]}
        policies[request["id"]] = {"tools": [rule]}
    return {"policies": policies, "bindings": {"tenants": {request["id"]: request["id"] for request in requests}}}


def _problems_with(engine: PolicyEngine, request: dict[str, Any]) -> list[str]:
    policy = engine.policy_for(request["id"], "key_unbound")
    tools = request["body"]["tools"]
    first = tools[0]["function"]
    problems: list[str] = []
    kept, removed = engine.filter_tools(policy, tools)
    if kept != tools[:1] or removed != [tool["function"]["name"] for tool in tools[1:]]:
        problems.append(f"filter_tools kept {[tool['function']['name'] for tool in kept]}")
    arguments = orjson.dumps(_value_for(first["parameters"])).decode()
    if (decision := engine.decide(policy, first["name"], arguments)) != Allow():
        problems.append(f"{first['name']}({arguments}) -> {decision}")
    for hallucinated in (f"{first['name']}_v2", first["name"].swapcase(), f"{first['name']}; rm -rf /"):
        if not _denied(engine.decide(policy, hallucinated, arguments), "unknown_tool"):
            problems.append(f"hallucinated {hallucinated!r} was not an unknown tool")
    for other in tools[1:]:
        if not _denied(engine.decide(policy, other["function"]["name"], "{}"), "unknown_tool"):
            problems.append(f"unlisted {other['function']['name']!r} was not an unknown tool")
    if not _denied(engine.decide(policy, first["name"], arguments[:-1]), "malformed_arguments"):
        problems.append(f"truncated arguments {arguments[:-1]!r} were not malformed")
    return problems


def _denied(decision: object, code: str) -> bool:
    return isinstance(decision, Deny) and decision.code == code


def test_bfcl_requests_allow_their_whitelisted_tool_and_deny_everything_else() -> None:
    requests = _lines(REQUESTS)
    engine = PolicyEngine(parse_policy_file(_policy_file_allowing_first_tools(requests)))
    failures = {request["id"]: problems for request in requests if (problems := _problems_with(engine, request))}
    assert len(requests) == 240
    assert failures == {}


def test_bfcl_original_dotted_names_are_unknown_tools_once_renamed() -> None:
    # A model that learned BFCL's own names (`requests.get`) may still emit them; only the renamed
    # tool is on the whitelist.
    renamed = [request for request in _lines(REQUESTS) if "tool_name_map" in request]
    engine = PolicyEngine(parse_policy_file(_policy_file_allowing_first_tools(renamed)))
    decisions = {
        original: engine.decide(engine.policy_for(request["id"], "key_unbound"), original, "{}")
        for request in renamed
        for original in request["tool_name_map"].values()
    }
    assert len(renamed) == 63
    assert {original for original, decision in decisions.items() if not _denied(decision, "unknown_tool")} == set()


def test_bfcl_multiturn_tool_sets_are_allowed_whole_with_their_schemas() -> None:
    sessions = _lines(SESSIONS)
    policies = {
        session["id"]: {
            "tools": [
                {"name": tool["function"]["name"], "risk": "low", "arguments": tool["function"]["parameters"]}
                for tool in session["tools"]
            ]
        }
        for session in sessions
    }
    engine = PolicyEngine(parse_policy_file({"policies": policies, "bindings": {"tenants": {s: s for s in policies}}}))
    failures: list[str] = []
    for session in sessions:
        policy = engine.policy_for(session["id"], "key_unbound")
        if engine.filter_tools(policy, session["tools"]) != (session["tools"], []):
            failures.append(f"{session['id']}: filter_tools removed a listed tool")
        for tool in session["tools"]:
            function = tool["function"]
            arguments = orjson.dumps(_value_for(function["parameters"])).decode()
            if (decision := engine.decide(policy, function["name"], arguments)) != Allow():
                failures.append(f"{session['id']}: {function['name']}({arguments}) -> {decision}")
    assert failures == []
