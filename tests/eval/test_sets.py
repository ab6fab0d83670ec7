from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pydantic
import pytest
import yaml

from eval.sets import EvalSetError, MaxChars, Not, NoToolCall, Regex, ToolCall, load_eval_set, parse_eval_set

EXAMPLE = Path(__file__).resolve().parents[2] / "eval" / "examples" / "smoke.yaml"


def minimal(**case: Any) -> dict[str, Any]:
    base = {"id": "c1", "messages": [{"role": "user", "content": "hi"}], "assertions": [{"max_chars": 10}]}
    return {"id": "s", "version": "1", "cases": [{**base, **case}]}


def problems_of(data: object) -> list[str]:
    with pytest.raises(EvalSetError) as caught:
        parse_eval_set(data)
    return caught.value.problems


def test_example_set_loads_with_three_cases() -> None:
    eval_set = load_eval_set(EXAMPLE)
    assert (eval_set.id, eval_set.version, len(eval_set.cases)) == ("smoke", "1", 3)


def test_shorthand_and_full_assertion_forms_load_to_the_same_model() -> None:
    short = parse_eval_set(minimal(assertions=[{"regex": "^a"}, {"no_tool_call": True}, {"tool_call": "f"}]))
    full = parse_eval_set(
        minimal(
            assertions=[
                {"kind": "regex", "pattern": "^a"},
                {"kind": "no_tool_call"},
                {"kind": "tool_call", "name": "f"},
            ]
        )
    )
    assert short.cases[0].assertions == (Regex(pattern="^a"), NoToolCall(), ToolCall(name="f"))
    assert short.digest == full.digest


def test_error_names_key_path_of_bad_assertion_field() -> None:
    problems = problems_of(minimal(assertions=[{"max_chars": 5}, {"max_chars": -1}]))
    assert problems == ["cases[0].assertions[1].max_chars.limit: Input should be greater than or equal to 0"]


def test_unknown_request_override_is_rejected_with_its_path() -> None:
    problems = problems_of(minimal(request={"max_tokenz": 3}))
    assert problems == ["cases[0].request.max_tokenz: Extra inputs are not permitted"]


def test_invalid_regex_and_invalid_schema_fail_loading() -> None:
    problems = problems_of(minimal(assertions=[{"regex": "("}, {"json_schema": {"type": "nonsense"}}]))
    assert problems[0].startswith("cases[0].assertions[0].regex.pattern: invalid regular expression")
    assert problems[1].startswith("cases[0].assertions[1].json_schema.schema: invalid JSON Schema")


def test_assertion_without_a_kind_is_rejected() -> None:
    problems = problems_of(minimal(assertions=[{"bogus": 1}]))
    assert problems[0].startswith("cases[0].assertions[0]: an assertion needs exactly one kind key")


def test_missing_top_level_keys_and_message_role_are_reported() -> None:
    problems = problems_of({"cases": [{"id": "c", "messages": [{"content": "x"}], "assertions": [{"max_chars": 1}]}]})
    assert "id: Field required" in problems
    assert "version: Field required" in problems
    assert "cases[0].messages: message 0 has no string 'role'" in problems


def test_duplicate_case_ids_are_rejected() -> None:
    data = minimal()
    data["cases"].append(data["cases"][0])
    assert problems_of(data) == ["(top level): duplicate case id 'c1'"]


def test_loaded_set_is_frozen() -> None:
    eval_set = parse_eval_set(minimal())
    with pytest.raises(pydantic.ValidationError):
        eval_set.id = "other"


def test_digest_is_stable_across_key_order_and_file_format(tmp_path: Path) -> None:
    data = minimal(request={"max_tokens": 3, "temperature": 0})
    reordered = {"cases": [dict(reversed(list(data["cases"][0].items())))], "version": "1", "id": "s"}
    as_yaml = tmp_path / "s.yaml"
    as_yaml.write_text(yaml.safe_dump(reordered))
    header = {k: v for k, v in data.items() if k != "cases"}
    as_jsonl = tmp_path / "s.jsonl"
    as_jsonl.write_bytes(b"\n".join(orjson.dumps(row) for row in [header, *data["cases"]]))
    digests = {parse_eval_set(data).digest, load_eval_set(as_yaml).digest, load_eval_set(as_jsonl).digest}
    assert len(digests) == 1


def test_digest_changes_when_content_changes() -> None:
    base = parse_eval_set(minimal()).digest
    assert parse_eval_set(minimal(assertions=[{"max_chars": 11}])).digest != base
    assert parse_eval_set({**minimal(), "version": "2"}).digest != base


def test_integer_version_in_yaml_loads_as_text(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**minimal(), "version": 3}))
    assert load_eval_set(path).version == "3"


def test_jsonl_reports_invalid_line_number(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"id": "s", "version": "1"}\n{not json\n')
    with pytest.raises(EvalSetError, match="line 2: invalid JSON"):
        load_eval_set(path)


def test_unsupported_extension_and_missing_file_are_errors(tmp_path: Path) -> None:
    with pytest.raises(EvalSetError, match=r"expected a \.yaml"):
        load_eval_set(tmp_path / "set.txt")
    with pytest.raises(EvalSetError, match="cannot read"):
        load_eval_set(tmp_path / "absent.yaml")


def test_case_defaults_are_empty() -> None:
    case = parse_eval_set(minimal()).cases[0]
    assert (case.tools, case.tags, case.assertions) == (None, (), (MaxChars(limit=10),))


def test_not_shorthand_and_full_forms_load_to_the_same_model_and_digest() -> None:
    short = parse_eval_set(minimal(assertions=[{"not": {"regex": "^a"}}, {"not": {"no_tool_call": True}}]))
    full = parse_eval_set(
        minimal(
            assertions=[
                {"kind": "not", "assertion": {"kind": "regex", "pattern": "^a"}},
                {"kind": "not", "assertion": {"kind": "no_tool_call"}},
            ]
        )
    )
    assert short == full
    assert short.digest == full.digest
    assert short.cases[0].assertions[0] == Not(assertion=Regex(pattern="^a"))


def test_not_contains_still_loads_as_its_own_kind() -> None:
    loaded = parse_eval_set(minimal(assertions=[{"not_contains": "x"}]))
    assert loaded.cases[0].assertions[0].kind == "not_contains"


def test_invalid_assertion_inside_not_is_reported_with_its_key_path() -> None:
    assert problems_of(minimal(assertions=[{"not": {"max_chars": -1}}])) == [
        "cases[0].assertions[0].not.assertion.max_chars.limit: Input should be greater than or equal to 0"
    ]
    assert problems_of(minimal(assertions=[{"not": {"regex": "("}}]))[0].startswith(
        "cases[0].assertions[0].not.assertion.regex.pattern: invalid regular expression"
    )


def test_weight_and_threshold_default_to_one_and_validate() -> None:
    loaded = parse_eval_set(minimal())
    assert (loaded.threshold, loaded.cases[0].weight) == (1.0, 1.0)
    weighted = parse_eval_set({**minimal(weight=2.5), "threshold": 0.8})
    assert (weighted.threshold, weighted.cases[0].weight) == (0.8, 2.5)
    assert problems_of(minimal(weight=0))[0].startswith("cases[0].weight: Input should be greater than 0")
    assert problems_of({**minimal(), "threshold": 1.5})[0].startswith("threshold: Input should be less than")


def test_default_weight_and_threshold_leave_the_digest_unchanged() -> None:
    # Digests pinned before weights and thresholds existed must still match.
    assert load_eval_set(EXAMPLE).digest == "11ca4ffbfdd661a85b30affe97cb91bbdd6428881b525140ac80600912ada98f"
    plain = parse_eval_set(minimal()).digest
    assert parse_eval_set({**minimal(weight=1), "threshold": 1}).digest == plain
    assert parse_eval_set(minimal(weight=2)).digest != plain
    assert parse_eval_set({**minimal(), "threshold": 0.9}).digest != plain
