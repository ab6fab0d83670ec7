from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from policies import (
    ApprovalMode,
    OnForbidden,
    PolicyError,
    Risk,
    load_policy_file,
    parse_policy_file,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"


def _file(tools: list[dict[str, Any]], **bindings: dict[str, str]) -> dict[str, Any]:
    return {"policies": {"support": {"tools": tools}}, "bindings": bindings}


def _problems(raw: Any) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy_file(raw)
    return caught.value.problems


def test_demo_example_loads_with_its_bindings_and_overrides() -> None:
    file = load_policy_file(EXAMPLES / "demo.yaml")
    support = file.policies["support-agent"]
    assert support.approval.mode is ApprovalMode.WAIT
    assert support.approval.timeout_s == 300
    assert [tool.risk for tool in support.tools][:3] == [Risk.LOW, Risk.LOW, Risk.HIGH]
    assert support.tools[3].approval_mode is ApprovalMode.DEFER
    assert file.policies["read-only"].on_forbidden_tools is OnForbidden.REJECT
    assert file.bindings.keys == {"key_0123abcd": "read-only"}


def test_defaults_are_strip_and_wait_with_an_empty_file_allowing_nothing() -> None:
    file = parse_policy_file({"policies": {"p": {}}})
    assert file.policies["p"].on_forbidden_tools is OnForbidden.STRIP
    assert file.policies["p"].approval.mode is ApprovalMode.WAIT
    assert file.policies["p"].tools == ()
    assert parse_policy_file({}).policies == {}


def test_a_bad_risk_is_reported_with_its_key_path() -> None:
    tools = [{"name": "a", "risk": "low"}, {"name": "b", "risk": "low"}, {"name": "c", "risk": "medium"}]
    assert _problems(_file(tools)) == ["policies.support.tools[2].risk: Input should be 'low' or 'high'"]


def test_unknown_keys_are_forbidden_at_every_level() -> None:
    raw = {
        "policies": {"support": {"tols": [], "approval": {"mode": "wait", "timeout": 5}}},
        "bindings": {"tenant": {}},
        "version": 2,
    }
    assert sorted(_problems(raw)) == [
        "bindings.tenant: unknown key",
        "policies.support.approval.timeout: unknown key",
        "policies.support.tols: unknown key",
        "version: unknown key",
    ]


@pytest.mark.parametrize("name", ["get weather", "get.weather", "", "x" * 65, "get_weather\n", "wetter_für_morgen"])
def test_tool_names_outside_the_openai_pattern_are_rejected(name: str) -> None:
    [problem] = _problems(_file([{"name": name, "risk": "low"}]))
    assert problem.startswith("policies.support.tools[0].name: String should match pattern")


def test_an_invalid_arguments_schema_names_the_path_inside_the_schema() -> None:
    schema = {"type": "object", "properties": {"amount": {"type": "numbr"}}}
    assert _problems(_file([{"name": "refund", "risk": "high", "arguments": schema}])) == [
        "policies.support.tools[0].arguments.properties.amount.type: "
        "'numbr' is not valid under any of the given schemas"
    ]


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"properties": {"id": {"type": "string", "pattern": "(["}}}, "arguments.properties.id.pattern: '([' is not a"),
        ({"$ref": "https://example.com/schema.json"}, "arguments.$ref: only references inside the schema"),
        ({"$ref": "#/$defs/missing"}, "arguments.$ref: reference '#/$defs/missing' does not resolve"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "arguments.$schema: only JSON Schema Draft 2020-12"),
        ({"type": "object", "required": "amount"}, "arguments.required: 'amount' is not of type 'array'"),
    ],
)
def test_argument_schemas_that_cannot_be_used_are_rejected(schema: dict[str, Any], fragment: str) -> None:
    [problem] = _problems(_file([{"name": "refund", "risk": "high", "arguments": schema}]))
    assert f"policies.support.tools[0].{fragment}" in problem


def test_a_local_reference_and_a_ref_shaped_enum_value_are_accepted() -> None:
    schema = {
        "$defs": {"id": {"type": "string"}},
        "properties": {"id": {"$ref": "#/$defs/id"}},
        "enum": [{"$ref": "x"}],
    }
    file = parse_policy_file(_file([{"name": "lookup", "risk": "low", "arguments": schema}]))
    assert file.policies["support"].tools[0].arguments == schema


def test_a_binding_to_an_unknown_policy_is_rejected() -> None:
    raw = _file([], tenants={"acme": "suport"}, keys={"key_1": "support"})
    assert _problems(raw) == ["bindings.tenants.acme: unknown policy 'suport' (defined: support)"]


def test_duplicate_tool_names_are_rejected() -> None:
    tools = [{"name": "a", "risk": "low"}, {"name": "b", "risk": "low"}, {"name": "a", "risk": "high"}]
    assert _problems(_file(tools)) == ["policies.support.tools[2].name: duplicate tool 'a' (also tools[0])"]


def test_a_file_with_several_problems_is_rejected_whole_listing_each() -> None:
    tools: list[dict[str, Any]] = [
        {"name": "a", "risk": "low"},
        {"name": "a", "risk": "medium"},
        {"name": "b", "risk": "low", "arguments": {"type": "nope"}},
    ]
    raw = _file(tools, tenants={"acme": "missing"})
    raw["policies"]["read-only"] = {"on_forbidden_tools": "drop"}
    problems = _problems(raw)
    assert "policies.support.tools[1].risk: Input should be 'low' or 'high'" in problems
    assert any(p.startswith("policies.support.tools[2].arguments.type: 'nope' is not valid") for p in problems)
    assert "policies.read-only.on_forbidden_tools: Input should be 'strip' or 'reject'" in problems
    # Cross-references are listed too, although the models that check them never got to run.
    assert "policies.support.tools[1].name: duplicate tool 'a' (also tools[0])" in problems
    assert "bindings.tenants.acme: unknown policy 'missing' (defined: read-only, support)" in problems
    assert len(problems) == 5


def test_an_approval_ttl_shorter_than_its_wait_is_rejected() -> None:
    raw = {"policies": {"p": {"approval": {"timeout_s": 600, "ttl_s": 60}}}}
    assert _problems(raw) == ["policies.p.approval: ttl_s (60) must be at least timeout_s (600)"]


@pytest.mark.parametrize("value", [True, "300", 0, -1, float("inf")])
def test_approval_timeouts_must_be_positive_finite_numbers(value: Any) -> None:
    [problem] = _problems({"policies": {"p": {"approval": {"timeout_s": value}}}})
    assert problem.startswith("policies.p.approval.timeout_s: ")


def test_a_per_tool_approval_mode_only_applies_to_high_risk_tools() -> None:
    raw = _file([{"name": "a", "risk": "low", "approval_mode": "defer"}])
    assert _problems(raw) == ["policies.support.tools[0]: approval_mode applies only to tools with risk: high"]


def test_models_are_frozen() -> None:
    file = parse_policy_file(_file([{"name": "a", "risk": "low"}]))
    with pytest.raises(pydantic.ValidationError):
        file.policies["support"].tools[0].risk = Risk.HIGH


def test_a_document_that_is_not_a_mapping_is_rejected() -> None:
    assert _problems(["policies"]) == ["<root>: a policy file must be a mapping"]
    assert _problems(None) == ["<root>: a policy file must be a mapping"]


def test_invalid_yaml_is_a_policy_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("policies:\n  support: [unclosed\n", encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy_file(path)
    assert caught.value.problems[0].startswith(f"{path}: not valid YAML")


def test_a_repeated_yaml_key_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("policies:\n  support: {}\n  support:\n    tools: []\n", encoding="utf-8")
    with pytest.raises(PolicyError, match="found duplicate key 'support'"):
        load_policy_file(path)


def test_a_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy_file(tmp_path / "absent.yaml")


def test_a_yaml_date_in_a_schema_is_rejected_as_not_json(tmp_path: Path) -> None:
    path = tmp_path / "date.yaml"
    path.write_text("policies:\n  p:\n    tools:\n      - {name: a, risk: low, arguments: {const: 2024-01-01}}\n")
    with pytest.raises(PolicyError, match=r"policies\.p\.tools\[0\]\.arguments: must be plain JSON data"):
        load_policy_file(path)
