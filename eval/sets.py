"""Eval sets: the cases a model release must pass, loaded from YAML or JSONL and validated.

YAML holds one mapping with `id`, `version`, optional `description` and `cases`. JSONL holds the same
header (without `cases`) on its first line and one case per following line, so large sets diff well.

Assertions are written either in full (`{kind: regex, pattern: "^a"}`) or in the shorthand form
`{regex: "^a"}`, where the kind's key carries its main field; both load to the same model, so both
give the same digest. Any assertion can be negated: `{not: {regex: "^a"}}` (in full,
`{kind: not, assertion: {kind: regex, pattern: "^a"}}`) passes when the inner assertion fails.

A case may carry a `weight` (> 0, default 1) and a set a `threshold` (0..1, default 1): the score is
the weighted share of passed cases, and the gate wants it at or above the threshold.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
import orjson
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from common.problems import key_path


class EvalSetError(ValueError):
    """A set file that cannot be read or does not validate; `problems` name the key paths."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__(f"{path}: " + "; ".join(problems))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Contains(_Frozen):
    kind: Literal["contains"] = "contains"
    text: str
    case_sensitive: bool = True


class NotContains(_Frozen):
    kind: Literal["not_contains"] = "not_contains"
    text: str
    case_sensitive: bool = True


class Regex(_Frozen):
    kind: Literal["regex"] = "regex"
    pattern: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        # A typo in a pattern should fail when the set loads, not as a failed case during a release.
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(f"invalid regular expression: {error}") from error
        return value


class Equals(_Frozen):
    kind: Literal["equals"] = "equals"
    text: str
    strip: bool = True


class MaxChars(_Frozen):
    kind: Literal["max_chars"] = "max_chars"
    limit: int = Field(ge=0)


def _check_schema(value: dict[str, Any]) -> dict[str, Any]:
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.SchemaError as error:
        raise ValueError(f"invalid JSON Schema: {error.message}") from error
    return value


class JsonSchema(_Frozen):
    kind: Literal["json_schema"] = "json_schema"
    # `schema` shadows a BaseModel attribute, hence the alias.
    json_schema: dict[str, Any] = Field(alias="schema")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("json_schema")
    @classmethod
    def _valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_schema(value)


class ToolCall(_Frozen):
    kind: Literal["tool_call"] = "tool_call"
    name: str
    arguments: dict[str, Any] | None = None

    @field_validator("arguments")
    @classmethod
    def _valid(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _check_schema(value)


class NoToolCall(_Frozen):
    kind: Literal["no_tool_call"] = "no_tool_call"


class FinishReason(_Frozen):
    kind: Literal["finish_reason"] = "finish_reason"
    value: str


# The field that the shorthand `{kind: value}` fills, per kind.
_MAIN_FIELD: dict[str, str | None] = {
    "contains": "text",
    "not_contains": "text",
    "regex": "pattern",
    "equals": "text",
    "max_chars": "limit",
    "json_schema": "schema",
    "tool_call": "name",
    "no_tool_call": None,
    "finish_reason": "value",
    "not": "assertion",
}
KINDS = tuple(_MAIN_FIELD)


def _expand_shorthand(raw: object) -> object:
    if not isinstance(raw, dict) or "kind" in raw:
        return raw
    named = [key for key in raw if key in _MAIN_FIELD]
    if len(named) != 1:
        raise ValueError(f"an assertion needs exactly one kind key or a 'kind' field; kinds: {', '.join(KINDS)}")
    kind = named[0]
    rest = {key: value for key, value in raw.items() if key != kind}
    value = raw[kind]
    main = _MAIN_FIELD[kind]
    if kind == "tool_call" and isinstance(value, dict):
        return {"kind": kind, **value, **rest}
    if main is None:
        if value not in (None, True):
            raise ValueError(f"'{kind}' takes no value (write '{kind}: true')")
        return {"kind": kind, **rest}
    return {"kind": kind, main: value, **rest}


class Not(_Frozen):
    """Passes when `assertion` fails, and fails when it passes."""

    kind: Literal["not"] = "not"
    assertion: Assertion


Assertion = Annotated[
    Contains | NotContains | Regex | Equals | MaxChars | JsonSchema | ToolCall | NoToolCall | FinishReason | Not,
    Field(discriminator="kind"),
    BeforeValidator(_expand_shorthand),
]
Not.model_rebuild()


class RequestOverrides(_Frozen):
    """Request fields a case may set; closed so a misspelt knob fails loading instead of being ignored."""

    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class EvalCase(_Frozen):
    id: str = Field(min_length=1)
    messages: tuple[dict[str, Any], ...] = Field(min_length=1)
    tools: tuple[dict[str, Any], ...] | None = None
    request: RequestOverrides = RequestOverrides()
    tags: tuple[str, ...] = ()
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    assertions: tuple[Assertion, ...] = Field(min_length=1)

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        for index, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                raise ValueError(f"message {index} has no string 'role'")
        return messages


_DEFAULT_WEIGHT = 1.0
_DEFAULT_THRESHOLD = 1.0


def _version_text(value: object) -> object:
    # YAML reads `version: 3` as an int and `version: 1.2` as a float; a version is a label.
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


class EvalSet(_Frozen):
    id: str = Field(min_length=1)
    version: Annotated[str, BeforeValidator(_version_text), Field(min_length=1)]
    description: str = ""
    threshold: float = Field(default=1.0, ge=0, le=1)
    cases: tuple[EvalCase, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_case_ids(self) -> EvalSet:
        seen: set[str] = set()
        for case in self.cases:
            if case.id in seen:
                raise ValueError(f"duplicate case id {case.id!r}")
            seen.add(case.id)
        return self

    def canonical_json(self) -> bytes:
        """Sorted-key JSON of the validated set, defaults included, so equivalent files agree.

        `threshold` and `weight` came later: they are left out at their defaults, so sets written
        before them keep the digests releases already pinned.
        """
        document = self.model_dump(mode="json", by_alias=True)
        if self.threshold == _DEFAULT_THRESHOLD:
            del document["threshold"]
        for case in document["cases"]:
            if case["weight"] == _DEFAULT_WEIGHT:
                del case["weight"]
        return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the canonical JSON; a release pins it along with id and version."""
        return hashlib.sha256(self.canonical_json()).hexdigest()


def _read_jsonl(text: str, path: Path) -> dict[str, Any]:
    rows: list[Any] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError as error:
            raise EvalSetError(path, [f"line {number}: invalid JSON: {error}"]) from error
    if not rows or not isinstance(rows[0], dict):
        raise EvalSetError(path, ["line 1: expected a header object with id and version"])
    if "cases" in rows[0]:
        raise EvalSetError(path, ["line 1: the JSONL header holds no 'cases'; put one case per line"])
    return {**rows[0], "cases": rows[1:]}


def parse_eval_set(data: object, source: Path | str = "<data>") -> EvalSet:
    """Validate already-parsed data; raises `EvalSetError` listing each problem with its key path."""
    try:
        return EvalSet.model_validate(data)
    except ValidationError as error:
        raise EvalSetError(source, _problems(error)) from error


def _problems(error: ValidationError) -> list[str]:
    items = error.errors()
    locs = [tuple(item["loc"]) for item in items]
    problems = []
    for item, loc in zip(items, locs, strict=True):
        # pydantic also reports a list as too short when its only items failed; that is noise.
        if item["type"] == "too_short" and any(len(other) > len(loc) and other[: len(loc)] == loc for other in locs):
            continue
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{key_path(loc) or '(top level)'}: {message}")
    return problems


def _yaml_problem(error: yaml.YAMLError) -> str:
    """Where and what, never the text: the parser's own message quotes the offending line, which
    may be a secret of a file that was never meant to be an eval set."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or "not valid YAML"
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"invalid YAML{where}: {problem}"


def load_eval_set(path: Path | str) -> EvalSet:
    """Load a `.yaml`/`.yml` or `.jsonl` eval set."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".yaml", ".yml"):
        raise EvalSetError(path, ["expected a .yaml, .yml or .jsonl file"])
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise EvalSetError(path, [f"cannot read: {error.strerror or error}"]) from error
    if path.suffix == ".jsonl":
        data: object = _read_jsonl(text, path)
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise EvalSetError(path, [_yaml_problem(error)]) from error
    return parse_eval_set(data, path)
