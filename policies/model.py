"""Policy files: which tools an agent may call, with which arguments, and which calls wait for a person.

Every model is frozen and forbids unknown keys, so a typo is an error naming its key path
(`policies.support.tools[2].risk: Input should be 'low' or 'high'`) rather than a rule silently not
applied. A file with any problem is rejected whole, with every problem listed: a half-loaded policy
would allow or deny calls nobody wrote down.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from common.problems import key_path, pydantic_message
from policies.arguments import Loc, schema_problems

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# pydantic's error type for problems found by our own validators, each with its own sub-path.
_PROBLEMS = "policy_problems"

ToolName = Annotated[str, StringConstraints(pattern=TOOL_NAME_PATTERN)]
# strict: YAML's `yes` would otherwise be accepted as 1 second.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]


class Risk(StrEnum):
    LOW = "low"  # allowed without asking anyone
    HIGH = "high"  # each call waits for a person's approval


class ApprovalMode(StrEnum):
    WAIT = "wait"  # hold the response until the call is decided
    DEFER = "defer"  # answer at once; the call continues once decided


class OnForbidden(StrEnum):
    STRIP = "strip"  # remove forbidden tools from the request before the model sees them
    REJECT = "reject"  # refuse the whole request


class PolicyError(Exception):
    """A policy file that cannot be used; `problems` lists every `path: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _problems_error(problems: list[tuple[Loc, str]]) -> PydanticCustomError:
    summary = "; ".join(f"{key_path(loc) or '<here>'}: {message}" for loc, message in problems)
    return PydanticCustomError(_PROBLEMS, "{summary}", {"summary": summary, "problems": problems})


def _duplicate_tools(names: Sequence[object]) -> list[tuple[Loc, str]]:
    first: dict[str, int] = {}
    problems: list[tuple[Loc, str]] = []
    for index, name in enumerate(names):
        if not isinstance(name, str):
            continue
        if name in first:
            problems.append(((index, "name"), f"duplicate tool {name!r} (also tools[{first[name]}])"))
        else:
            first[name] = index
    return problems


def _unknown_bindings(policy_names: Collection[str], bindings: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    known = ", ".join(sorted(policy_names)) or "none"
    problems: list[tuple[Loc, str]] = []
    for kind in ("tenants", "keys"):
        table = bindings.get(kind)
        if not isinstance(table, Mapping):
            continue
        for subject, name in table.items():
            if isinstance(name, str) and name not in policy_names:
                problems.append((("bindings", kind, subject), f"unknown policy {name!r} (defined: {known})"))
    return problems


class ApprovalSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: ApprovalMode = ApprovalMode.WAIT
    timeout_s: Seconds = 300.0
    ttl_s: Seconds = 3600.0

    @model_validator(mode="after")
    def _decidable_while_waiting(self) -> ApprovalSettings:
        # An approval that expired while its call still waited could never be granted.
        if self.ttl_s < self.timeout_s:
            raise ValueError(f"ttl_s ({self.ttl_s:g}) must be at least timeout_s ({self.timeout_s:g})")
        return self


class ToolRule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ToolName
    risk: Risk
    arguments: dict[str, Any] | None = None
    approval_mode: ApprovalMode | None = None  # overrides the policy's approval.mode for this tool

    @field_validator("arguments")
    @classmethod
    def _usable_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None and (problems := schema_problems(schema)):
            raise _problems_error(problems)
        return schema

    @model_validator(mode="after")
    def _mode_needs_approval(self) -> ToolRule:
        if self.approval_mode is not None and self.risk is not Risk.HIGH:
            raise ValueError("approval_mode applies only to tools with risk: high")
        return self


class Policy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    on_forbidden_tools: OnForbidden = OnForbidden.STRIP
    approval: ApprovalSettings = Field(default_factory=ApprovalSettings)
    tools: tuple[ToolRule, ...] = ()

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: tuple[ToolRule, ...]) -> tuple[ToolRule, ...]:
        if problems := _duplicate_tools([tool.name for tool in tools]):
            raise _problems_error(problems)
        return tools


class Bindings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tenants: dict[str, str] = Field(default_factory=dict)  # tenant -> its default policy
    keys: dict[str, str] = Field(default_factory=dict)  # key id -> policy; wins over its tenant's


class PolicyFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policies: dict[str, Policy] = Field(default_factory=dict)
    bindings: Bindings = Field(default_factory=Bindings)

    @model_validator(mode="after")
    def _bindings_name_policies(self) -> PolicyFile:
        tables = {"tenants": self.bindings.tenants, "keys": self.bindings.keys}
        if problems := _unknown_bindings(self.policies.keys(), tables):
            raise _problems_error(problems)
        return self


def _validation_problems(exc: ValidationError) -> list[str]:
    problems: list[str] = []
    for error in exc.errors():
        loc: Loc = tuple(error["loc"])
        if error["type"] == _PROBLEMS:
            for sub_loc, message in error["ctx"]["problems"]:
                problems.append(f"{key_path(loc + sub_loc) or '<root>'}: {message}")
        else:
            problems.append(f"{key_path(loc) or '<root>'}: {pydantic_message(error)}")
    return problems


def _cross_reference_problems(raw: Mapping[str, Any]) -> list[str]:
    """Duplicate tools and unknown bindings, read from the raw document.

    The model validators find these too, but pydantic skips a model's validator once one of its
    fields failed; reading the raw document lists them alongside every other problem.
    """
    policies = raw.get("policies")
    if not isinstance(policies, Mapping):
        return []
    problems: list[tuple[Loc, str]] = []
    for name, policy in policies.items():
        tools = policy.get("tools") if isinstance(policy, Mapping) else None
        if isinstance(tools, list):
            names = [tool.get("name") if isinstance(tool, Mapping) else None for tool in tools]
            problems += [(("policies", name, "tools", *loc), msg) for loc, msg in _duplicate_tools(names)]
    bindings = raw.get("bindings")
    if isinstance(bindings, Mapping):
        problems += _unknown_bindings({str(name) for name in policies}, bindings)
    return [f"{key_path(loc)}: {message}" for loc, message in problems]


def parse_policy_file(raw: Any) -> PolicyFile:
    """Validate a decoded YAML document; raise PolicyError listing every problem."""
    if not isinstance(raw, Mapping):
        raise PolicyError(["<root>: a policy file must be a mapping"])
    try:
        return PolicyFile.model_validate(raw)
    except ValidationError as exc:
        problems = _validation_problems(exc)
    problems += [problem for problem in _cross_reference_problems(raw) if problem not in problems]
    raise PolicyError(problems)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses repeated mapping keys, which PyYAML would resolve to the last silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<:` merges are meant to be overridden by the keys beside them
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:
                continue  # an unhashable key: SafeConstructor reports it below
            if repeated:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def load_policy_file(path: Path) -> PolicyFile:
    """Read and validate a policy file; raise PolicyError listing every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError([f"{path}: cannot read: {exc}"]) from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise PolicyError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_policy_file(raw)
