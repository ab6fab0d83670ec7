"""Decisions on tool calls: allow, deny, or wait for a person.

Secure by default: a caller with no policy gets no tools, and a tool not named in its policy is
denied whatever its name looks like (a hallucinated near-miss, a different case, an injected
`get_weather; rm -rf /` are all simply not in the whitelist; names are compared exactly).
Arguments are checked before approval is asked for, so nobody is asked to approve a call that
would be refused anyway.

decide() is on the request path, so everything that can be prepared is prepared once, when the
engine is built: each tool's schema validator is compiled and looked up by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from jsonschema.protocols import Validator

from policies.arguments import MalformedArguments, compile_validator, first_violation, parse_arguments_json
from policies.model import ApprovalMode, Policy, PolicyFile, Risk, ToolRule

DenyCode = Literal["unknown_tool", "malformed_arguments", "arguments_rejected", "no_policy"]

_NAME_LIMIT = 80


@dataclass(frozen=True, slots=True)
class Allow:
    """The call may run now."""


@dataclass(frozen=True, slots=True)
class Deny:
    """The call must not run; `reason` is for people, `code` for programs."""

    reason: str
    code: DenyCode


@dataclass(frozen=True, slots=True)
class NeedsApproval:
    """The call may run once a person approves it; how to wait comes from the policy."""

    rule: ToolRule
    mode: ApprovalMode
    timeout_s: float
    ttl_s: float


Decision = Allow | Deny | NeedsApproval


@dataclass(frozen=True, slots=True)
class _CompiledTool:
    rule: ToolRule
    validator: Validator | None


@dataclass(frozen=True, slots=True)
class _CompiledPolicy:
    policy: Policy
    tools: dict[str, _CompiledTool]


def _compile(policy: Policy) -> _CompiledPolicy:
    tools = {
        rule.name: _CompiledTool(rule, None if rule.arguments is None else compile_validator(rule.arguments))
        for rule in policy.tools
    }
    return _CompiledPolicy(policy, tools)


def _quote(name: str) -> str:
    # The name comes from a model's output; keep it short and printable in logs and replies.
    shown = name if len(name) <= _NAME_LIMIT else name[: _NAME_LIMIT - 1] + "…"
    return repr(shown)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"


def _function_name(tool: Any) -> str | None:
    if isinstance(tool, dict) and tool.get("type") == "function":
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return name if isinstance(name, str) else None
    return None


def _removed_label(tool: Any) -> str:
    """What to call a removed tool that has no function name: `<web_search>`, `<invalid>`."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    return f"<{kind}>" if isinstance(kind, str) and kind != "function" else "<invalid>"


class PolicyEngine:
    """Answers, for a validated policy file, which policy applies and what may be called."""

    def __init__(self, file: PolicyFile) -> None:
        self.file = file
        # Keyed by identity: policies are not hashable (their schemas are dicts), and policy_for()
        # hands out these very objects. The policy is kept in the value so its id stays unique.
        self._compiled = {id(policy): _compile(policy) for policy in file.policies.values()}

    def _compiled_for(self, policy: Policy) -> _CompiledPolicy:
        compiled = self._compiled.get(id(policy))
        if compiled is not None and compiled.policy is policy:
            return compiled
        # A policy from elsewhere is still judged correctly, only without the precompiled validators.
        return _compile(policy)

    def policy_for(self, tenant: str, key_id: str) -> Policy | None:
        """The key's policy if it has one, else its tenant's, else None (which allows nothing)."""
        bindings = self.file.bindings
        name = bindings.keys.get(key_id) or bindings.tenants.get(tenant)
        return None if name is None else self.file.policies[name]

    def may_use(self, policy: Policy | None, name: str) -> bool:
        return policy is not None and name in self._compiled_for(policy).tools

    def filter_tools(
        self, policy: Policy | None, tools: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Split OpenAI tool definitions into those the policy allows (kept, in order) and the
        names of the others. Anything that is not a well-formed function tool is removed too."""
        allowed = {} if policy is None else self._compiled_for(policy).tools
        kept: list[dict[str, Any]] = []
        removed: list[str] = []
        for tool in tools:
            name = _function_name(tool)
            if name is not None and name in allowed:
                kept.append(tool)
            else:
                removed.append(_removed_label(tool) if name is None else name)
        return kept, removed

    @staticmethod
    def tool_choice_target(tool_choice: Any) -> str | None:
        """The function a `tool_choice` forces, if any (`"auto"`, `"required"`... force none)."""
        if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function":
            return None
        function = tool_choice.get("function")
        # Chat Completions nests the name under `function`; the Responses API puts it beside `type`.
        name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
        return name if isinstance(name, str) else None

    def decide(self, policy: Policy | None, name: str, arguments_json: str) -> Decision:
        """Judge one tool call: its name against the whitelist, its arguments against the schema."""
        if policy is None:
            return Deny("no tool policy applies to this key or tenant", "no_policy")
        tool = self._compiled_for(policy).tools.get(name)
        if tool is None:
            return Deny(f"tool {_quote(name)} is not allowed by the policy", "unknown_tool")
        try:
            arguments = parse_arguments_json(arguments_json)
        except MalformedArguments as exc:
            return Deny(f"arguments: {exc}", "malformed_arguments")
        if not isinstance(arguments, dict):
            return Deny(f"arguments must be a JSON object, not {_json_type(arguments)}", "malformed_arguments")
        if tool.validator is not None and (violation := first_violation(tool.validator, arguments)):
            return Deny(violation, "arguments_rejected")
        rule = tool.rule
        if rule.risk is Risk.LOW:
            return Allow()
        settings = policy.approval
        return NeedsApproval(rule, rule.approval_mode or settings.mode, settings.timeout_s, settings.ttl_s)
