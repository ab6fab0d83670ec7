"""Issue 11, Low: JSON-Schema `format` (email, uri, date-time) was not enforced in tool argument
rules, and integers above 2^53 passed to tool servers that parse numbers as doubles and round
them. Formats are checked by the gateway's own checker; a schema naming a format it does not
check is refused at load; integers beyond +-(2^53 - 1) are malformed arguments."""

from __future__ import annotations

import orjson
import pytest
import yaml

from policies import Allow, Deny, Policy, PolicyEngine, PolicyError, parse_policy_file

POLICIES = """
policies:
  agent:
    tools:
      - name: notify
        risk: low
        arguments:
          type: object
          properties:
            to: {type: string, format: email}
            link: {type: string, format: uri}
            at: {type: string, format: date-time}
            day: {type: string, format: date}
            id: {type: string, format: uuid}
            host: {type: string, format: ipv4}
            count: {type: integer}
bindings:
  tenants: {acme: agent}
"""


@pytest.fixture
def engine() -> PolicyEngine:
    return PolicyEngine(parse_policy_file(yaml.safe_load(POLICIES)))


@pytest.fixture
def policy(engine: PolicyEngine) -> Policy:
    found = engine.policy_for("acme", "key_x")
    assert found is not None
    return found


def decide(engine: PolicyEngine, policy: Policy, **arguments: object) -> Allow | Deny:
    decision = engine.decide(policy, "notify", orjson.dumps(arguments).decode())
    assert isinstance(decision, Allow | Deny)
    return decision


@pytest.mark.parametrize(
    ("field", "good"),
    [
        ("to", "ops@example.com"),
        ("link", "https://example.com/a?b=c#d"),
        ("at", "2026-12-01T14:30:00Z"),
        ("at", "2026-12-01T14:30:00.5+02:00"),
        ("day", "2026-02-28"),
        ("id", "0b6c6d3e-4f5a-4c2b-9a1e-3d2f1b0c9e8d"),
        ("host", "10.0.0.1"),
    ],
)
def test_well_formed_values_pass(engine: PolicyEngine, policy: Policy, field: str, good: str) -> None:
    assert isinstance(decide(engine, policy, **{field: good}), Allow)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("to", "not-an-email"),
        ("to", "a@b"),
        ("to", "ops@example.com\nBcc: all@example.com"),
        ("link", "javascript alert(1)"),
        ("link", "no scheme here"),
        ("link", "https://exa mple.com/"),
        ("at", "yesterday"),
        ("at", "2026-13-01T00:00:00Z"),
        ("at", "2026-12-01 14:30"),
        ("day", "2026-02-30"),
        ("id", "not-a-uuid"),
        ("host", "999.1.1.1"),
    ],
)
def test_malformed_values_are_denied_naming_the_format(
    engine: PolicyEngine, policy: Policy, field: str, bad: str
) -> None:
    decision = decide(engine, policy, **{field: bad})
    assert isinstance(decision, Deny), decision
    assert decision.code == "arguments_rejected"
    assert decision.reason.startswith(f"{field}: ")
    assert "is not a" in decision.reason


def test_schema_with_a_format_the_gateway_does_not_check_is_refused() -> None:
    text = POLICIES.replace("format: ipv4", "format: iri-reference")
    with pytest.raises(PolicyError, match="iri-reference"):
        parse_policy_file(yaml.safe_load(text))


@pytest.mark.parametrize("value", [2**53, -(2**53), 2**63, 2**64 - 1])
def test_integers_beyond_2_pow_53_are_malformed(engine: PolicyEngine, policy: Policy, value: int) -> None:
    decision = engine.decide(policy, "notify", f'{{"count": {value}}}')
    assert isinstance(decision, Deny)
    assert decision.code == "malformed_arguments"
    assert "2^53" in decision.reason


def test_largest_safe_integer_passes(engine: PolicyEngine, policy: Policy) -> None:
    assert isinstance(decide(engine, policy, count=2**53 - 1), Allow)
    assert isinstance(decide(engine, policy, count=-(2**53 - 1)), Allow)
