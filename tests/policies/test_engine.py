from __future__ import annotations

from typing import Any

import pytest
import yaml

from policies import (
    Allow,
    ApprovalMode,
    Deny,
    NeedsApproval,
    Policy,
    PolicyEngine,
    Risk,
    ToolRule,
    parse_policy_file,
)

POLICIES = """
policies:
  support-agent:
    approval: {mode: wait, timeout_s: 120, ttl_s: 900}
    tools:
      - {name: get_weather, risk: low}
      - name: refund_payment
        risk: high
        arguments:
          type: object
          properties:
            amount: {type: number, maximum: 1000}
            order_id: {type: string, pattern: "^ord_[0-9]+$"}
            items: {type: array, items: {type: object, required: [sku]}}
          required: [amount, order_id]
      - {name: close_account, risk: high, approval_mode: defer}
  read-only:
    tools:
      - {name: get_weather, risk: low}
bindings:
  tenants: {acme: support-agent}
  keys: {key_0123abcd: read-only}
"""

REFUND = '{"amount": 120.5, "order_id": "ord_42"}'


@pytest.fixture
def engine() -> PolicyEngine:
    return PolicyEngine(parse_policy_file(yaml.safe_load(POLICIES)))


@pytest.fixture
def support(engine: PolicyEngine) -> Policy:
    policy = engine.policy_for("acme", "key_other")
    assert policy is not None
    return policy


def _function(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_without_a_policy_every_call_is_denied(engine: PolicyEngine) -> None:
    assert engine.policy_for("initech", "key_unbound") is None
    decision = engine.decide(None, "get_weather", "{}")
    assert isinstance(decision, Deny)
    assert decision.code == "no_policy"
    assert not engine.may_use(None, "get_weather")


def test_a_tool_not_in_the_whitelist_is_denied(engine: PolicyEngine, support: Policy) -> None:
    assert engine.decide(support, "delete_database", "{}") == Deny(
        "tool 'delete_database' is not allowed by the policy", "unknown_tool"
    )
    assert not engine.may_use(support, "delete_database")


def test_a_low_risk_whitelisted_tool_is_allowed(engine: PolicyEngine, support: Policy) -> None:
    assert engine.decide(support, "get_weather", '{"city": "Paris"}') == Allow()
    assert engine.may_use(support, "get_weather")


def test_a_high_risk_tool_needs_approval_with_the_policys_settings(engine: PolicyEngine, support: Policy) -> None:
    decision = engine.decide(support, "refund_payment", REFUND)
    assert isinstance(decision, NeedsApproval)
    assert decision.rule.name == "refund_payment"
    assert (decision.mode, decision.timeout_s, decision.ttl_s) == (ApprovalMode.WAIT, 120, 900)


def test_a_tools_own_approval_mode_overrides_the_policys(engine: PolicyEngine, support: Policy) -> None:
    decision = engine.decide(support, "close_account", "{}")
    assert isinstance(decision, NeedsApproval)
    assert decision.mode is ApprovalMode.DEFER


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ('{"amount": 5000, "order_id": "ord_1"}', "amount: 5000 is greater than the maximum of 1000"),
        ('{"amount": 5, "order_id": "1234"}', "order_id: '1234' does not match '^ord_[0-9]+$'"),
        ('{"amount": 5, "order_id": "ord_1\\n"}', "order_id: 'ord_1\\n' does not match '^ord_[0-9]+$'"),
        ('{"amount": 5}', "arguments: 'order_id' is a required property"),
        ('{"amount": "5", "order_id": "ord_1"}', "amount: '5' is not of type 'number'"),
        ('{"amount": 5, "order_id": "ord_1", "items": [{}]}', "items[0]: 'sku' is a required property"),
    ],
)
def test_arguments_breaking_the_schema_are_rejected_naming_the_argument(
    engine: PolicyEngine, support: Policy, arguments: str, reason: str
) -> None:
    assert engine.decide(support, "refund_payment", arguments) == Deny(reason, "arguments_rejected")


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ('{"amount": 5, "order_id": ', "not valid JSON"),
        ("amount=5", "not valid JSON"),
        ("", "not valid JSON"),
        ('{"amount": NaN, "order_id": "ord_1"}', "not valid JSON"),
        ('{"amount": 5, "amount": 5000, "order_id": "ord_1"}', "duplicate key 'amount'"),
        ('{"amount": 5, "order_id": "ord_1", "n": 123456789012345678901234}', "outside +-(2^53 - 1)"),
    ],
)
def test_arguments_that_are_not_one_unambiguous_json_document_are_malformed(
    engine: PolicyEngine, support: Policy, arguments: str, fragment: str
) -> None:
    decision = engine.decide(support, "refund_payment", arguments)
    assert isinstance(decision, Deny)
    assert decision.code == "malformed_arguments"
    assert fragment in decision.reason


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [("[1, 2]", "an array"), ('"ord_1"', "a string"), ("5", "a number"), ("null", "null"), ("true", "a boolean")],
)
def test_arguments_that_are_json_but_not_an_object_are_malformed(
    engine: PolicyEngine, support: Policy, arguments: str, kind: str
) -> None:
    assert engine.decide(support, "get_weather", arguments) == Deny(
        f"arguments must be a JSON object, not {kind}", "malformed_arguments"
    )


def test_arguments_already_decoded_by_a_backend_are_malformed(engine: PolicyEngine, support: Policy) -> None:
    decision = engine.decide(support, "get_weather", {"city": "Paris"})  # type: ignore[arg-type]
    assert isinstance(decision, Deny)
    assert decision.code == "malformed_arguments"


@pytest.mark.parametrize(
    "name",
    [
        "get_wether",
        "get_weather_v2",
        "Get_Weather",
        "GET_WEATHER",
        "get_weather; rm -rf /",
        "get_weather ",
        "get_weather\n",
        "get_weather\u200b",
        "functions.get_weather",
        "",
    ],
)
def test_hallucinated_or_injected_names_are_unknown_tools(engine: PolicyEngine, support: Policy, name: str) -> None:
    decision = engine.decide(support, name, "{}")
    assert isinstance(decision, Deny)
    assert decision.code == "unknown_tool"
    assert not engine.may_use(support, name)


def test_a_huge_tool_name_is_clipped_in_the_reason(engine: PolicyEngine, support: Policy) -> None:
    decision = engine.decide(support, "x" * 100_000, "{}")
    assert isinstance(decision, Deny)
    assert len(decision.reason) < 200


def test_a_keys_binding_beats_its_tenants(engine: PolicyEngine) -> None:
    assert engine.policy_for("acme", "key_0123abcd") is engine.file.policies["read-only"]
    assert engine.policy_for("acme", "key_other") is engine.file.policies["support-agent"]
    assert engine.policy_for("initech", "key_0123abcd") is engine.file.policies["read-only"]


def test_filter_tools_keeps_allowed_functions_in_order_and_names_the_rest(
    engine: PolicyEngine, support: Policy
) -> None:
    weather, refund = _function("get_weather"), _function("refund_payment")
    tools = [_function("delete_database"), weather, {"type": "web_search"}, refund, {"type": "function"}]
    kept, removed = engine.filter_tools(support, tools)
    assert kept == [weather, refund]
    assert removed == ["delete_database", "<web_search>", "<invalid>"]


def test_filter_tools_without_a_policy_removes_everything(engine: PolicyEngine) -> None:
    assert engine.filter_tools(None, [_function("get_weather")]) == ([], ["get_weather"])


def test_filter_tools_follows_the_keys_own_policy(engine: PolicyEngine) -> None:
    read_only = engine.policy_for("acme", "key_0123abcd")
    kept, removed = engine.filter_tools(read_only, [_function("get_weather"), _function("refund_payment")])
    assert [tool["function"]["name"] for tool in kept] == ["get_weather"]
    assert removed == ["refund_payment"]


@pytest.mark.parametrize(
    ("tool_choice", "target"),
    [
        ({"type": "function", "function": {"name": "refund_payment"}}, "refund_payment"),
        ({"type": "function", "name": "refund_payment"}, "refund_payment"),
        ("auto", None),
        ("required", None),
        ("none", None),
        (None, None),
        ({"type": "function", "function": {}}, None),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, None),
    ],
)
def test_tool_choice_target_is_the_forced_function_if_any(tool_choice: Any, target: str | None) -> None:
    assert PolicyEngine.tool_choice_target(tool_choice) == target


def _code(decision: object) -> str:
    assert isinstance(decision, Deny), decision
    return decision.code


def test_a_policy_built_outside_the_file_is_judged_the_same(engine: PolicyEngine) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    policy = Policy(tools=(ToolRule(name="get_weather", risk=Risk.LOW, arguments=schema),))
    assert engine.decide(policy, "get_weather", '{"city": "Paris"}') == Allow()
    assert _code(engine.decide(policy, "get_weather", '{"city": 1}')) == "arguments_rejected"
    assert _code(engine.decide(policy, "refund_payment", "{}")) == "unknown_tool"
