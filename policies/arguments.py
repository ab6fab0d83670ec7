"""Tool-call arguments: one strict JSON parser, one canonical form, and the JSON Schemas that bound them.

The gateway checks a call's arguments, but the tool server later runs them through its own JSON
parser. Anything two parsers may read differently is therefore refused here instead of being
interpreted: duplicate keys (some parsers keep the first, most keep the last), integers beyond
+-(2^53 - 1) (silently rounded by parsers that use doubles), NaN/Infinity and lone surrogates (not JSON at all). What is
accepted has exactly one meaning, so checking it and hashing it are checking what will run.

Argument schemas are JSON Schema Draft 2020-12. References must stay inside the schema: a remote
`$ref` would make the validator fetch a URL while deciding a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import extend
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from common.problems import key_path
from policies import formats

Loc = tuple[str | int, ...]

# The integers every JSON parser reads exactly: many (JavaScript's, Python's float path, Go's
# float64 default) hold numbers as IEEE doubles and round anything larger without a word.
_INT_MIN = -(2**53 - 1)
_INT_MAX = 2**53 - 1
_DRAFT_2020_12_URIS = ("https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#")
# Keywords whose values are data, not subschemas: a `"$ref"` key inside an enum value is not a reference.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
_REASON_LIMIT = 200


class MalformedArguments(ValueError):
    """Arguments that are not a single unambiguous JSON document."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise MalformedArguments(f"duplicate key {_clip(repr(key))}")
        result[key] = value
    return result


def _bounded_int(literal: str) -> int:
    value = int(literal)
    if not _INT_MIN <= value <= _INT_MAX:
        raise MalformedArguments(
            f"integer {_clip(literal)} is outside +-(2^53 - 1), the range every JSON parser reads exactly"
        )
    return value


def parse_arguments_json(text: str | bytes) -> Any:
    """Parse arguments strictly; raise MalformedArguments for anything not plain, unambiguous JSON."""
    if not isinstance(text, str | bytes):
        # Some backends send arguments already decoded; what they meant is no longer certain.
        raise MalformedArguments(f"expected JSON text, got {type(text).__name__}")
    try:
        # orjson rejects NaN, Infinity, lone surrogates and invalid UTF-8; it is the value returned.
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise MalformedArguments(f"not valid JSON: {exc}") from None
    try:
        # A second, hooked pass sees what orjson hides: repeated keys and integers it would round.
        json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_int=_bounded_int)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, MalformedArguments):
            raise
        raise MalformedArguments(f"not valid JSON: {exc}") from None
    return value


def canonical_json(value: Any) -> bytes:
    """The one byte form of a parsed JSON value: sorted keys, no whitespace."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _references(node: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if isinstance(node, dict):
        for key, child in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(child, str):
                yield (*loc, key), child
            elif key not in _DATA_KEYWORDS:
                yield from _references(child, (*loc, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _references(child, (*loc, index))


def _reference_problems(schema: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(dict(schema)))
    problems: list[tuple[Loc, str]] = []
    for loc, reference in _references(schema, ()):
        if not reference.startswith("#"):
            problems.append((loc, f"only references inside the schema ('#...') are allowed, not {reference!r}"))
            continue
        try:
            resolver.lookup(reference)
        except Unresolvable:
            problems.append((loc, f"reference {reference!r} does not resolve inside the schema"))
    return problems


def schema_problems(schema: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """Why `schema` cannot be used as an argument schema, each with its location inside the schema."""
    try:
        # YAML can produce values JSON cannot hold (an unquoted date, .inf); a schema must be JSON.
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return [((), f"must be plain JSON data: {exc}")]
    dialect = schema.get("$schema")
    if dialect is not None and dialect not in _DRAFT_2020_12_URIS:
        return [(("$schema",), f"only JSON Schema Draft 2020-12 is supported, not {dialect!r}")]
    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    error = best_match(meta.iter_errors(schema))
    if error is not None:
        return [(tuple(error.absolute_path), error.message)]
    return _reference_problems(schema) + _format_problems(schema, ())


def _format_problems(node: Any, loc: Loc) -> list[tuple[Loc, str]]:
    """A `format` the gateway does not check would look like a rule and enforce nothing."""
    problems: list[tuple[Loc, str]] = []
    if isinstance(node, dict):
        for key, child in node.items():
            if key == "format" and isinstance(child, str) and child not in formats.SUPPORTED:
                supported = ", ".join(sorted(formats.SUPPORTED))
                problems.append(
                    ((*loc, key), f"format {child!r} is not checked by the gateway (it checks {supported})")
                )
            elif key not in _DATA_KEYWORDS:
                problems += _format_problems(child, (*loc, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            problems += _format_problems(child, (*loc, index))
    return problems


def ecma_anchors(pattern: str) -> str:
    """Rewrite `$` to `\\Z`: Python's `$` also matches before a final newline, JSON Schema's (ECMA-262)
    only at the very end, so `^ord_[0-9]+$` would otherwise accept `"ord_1\\n"`."""
    out: list[str] = []
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            # `]` first in a class (after an optional `^`) is a literal, not the class's end.
            start = index + 1 + (pattern[index + 1 : index + 2] == "^")
            end = start + (pattern[start : start + 1] == "]")
            char, index, in_class = pattern[index:end], end - 1, True
        elif char == "$":
            char = r"\Z"
        out.append(char)
        index += 1
    return "".join(out)


def compile_validator(schema: Mapping[str, Any]) -> Validator:
    """A reusable validator; an empty registry guarantees it never retrieves anything remote."""
    compiled: dict[str, re.Pattern[str]] = {}

    def pattern(validator: Validator, regex: str, instance: Any, _schema: Any) -> Iterator[ValidationError]:
        # ECMA-262 semantics where Python's differ in ways that matter: `$` and ASCII-only `\\d`/`\\w`.
        if validator.is_type(instance, "string"):
            if regex not in compiled:
                compiled[regex] = re.compile(ecma_anchors(regex), re.ASCII)
            if not compiled[regex].search(instance):
                yield ValidationError(f"{instance!r} does not match {regex!r}")

    # The stubs leave extend() untyped; it returns a validator class.
    validator_class: type[Validator] = extend(Draft202012Validator, {"pattern": pattern})  # type: ignore[no-untyped-call]
    validator: Validator = validator_class(dict(schema), registry=Registry(), format_checker=formats.CHECKER)
    return validator


def _clip(text: str) -> str:
    # Reasons reach logs and clients; a model can put megabytes into an argument.
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"


def describe_violation(error: ValidationError) -> str:
    """`amount: 5000 is greater than the maximum of 1000`: the argument path, then the rule."""
    path = key_path(error.absolute_path) or "arguments"
    return _clip(f"{path}: {error.message}")


def first_violation(validator: Validator, instance: Any) -> str | None:
    """The most relevant schema violation of `instance`, or None when it conforms."""
    try:
        # Conforming calls are the common case: stop at the first error, and rank errors with
        # best_match only when there is one (it adds about half again to a conforming call).
        if next(validator.iter_errors(instance), None) is None:
            return None
        error = best_match(validator.iter_errors(instance))
    except Unresolvable as exc:
        # Schemas are checked for this at load time; a nested `$id` can still defeat that check.
        return f"arguments: the schema has an unresolvable reference ({exc})"
    return None if error is None else describe_violation(error)
