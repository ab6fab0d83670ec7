"""The typed release records: they serialize to the JSON the stores kept before records were typed
(so existing releases, canaries and activation histories load, and what is written now is what was
written then), records from before a field existed still load, and a malformed stored record fails
at the seam, naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.store import release_record
from gateway.store.release_record import Canary, CanarySettings, HistoryEntry, Release

# As ReleaseService.create wrote a release with every pin before records were typed, in that key order.
STORED_RELEASE: dict[str, Any] = {
    "model": "m1",
    "version": "v2",
    "deployments": ["d1", "d2"],
    "checkpoint": {"version": "ft@1200", "path": "/registry/ft/step-1200", "manifest_digest": "ab" * 32},
    "prompt": {"version": "p1", "system_prompt": "You are é/日本", "sha256": "cd" * 32},
    "eval_set": {
        "id": "qa",
        "version": "3",
        "digest": "ef" * 32,
        "path": "/sets/qa.yaml",
        "content": '{"id":"qa","version":"3","cases":[]}',
    },
    "thresholds": {"min_pass_rate": 0.1 + 0.2},
    "smoke": {
        "samples": "/samples/smoke.jsonl",
        "count": 10,
        "slo_ttft_ms": 250.0,
        "slo_tpot_ms": None,
        "min_goodput": 1.0,
    },
    "notes": "first try",
    "author": "k1",
    "created_at": 1700000000.125,
}
# A release with nothing pinned but its prompt: the unset pins are null, not absent.
BARE_RELEASE: dict[str, Any] = {
    **STORED_RELEASE,
    "checkpoint": None,
    "prompt": {"version": "", "system_prompt": "", "sha256": "e3" * 32},
    "eval_set": None,
    "thresholds": {"min_pass_rate": None},
    "smoke": None,
}
# As releases were written before smoke runs existed and before eval sets were pinned by content.
OLDEST_RELEASE: dict[str, Any] = {
    k: ({k2: v2 for k2, v2 in v.items() if k2 != "content"} if k == "eval_set" else v)
    for k, v in STORED_RELEASE.items()
    if k != "smoke"
}
# As start_canary wrote a stepped canary (the operator's settings first), after one step.
STORED_CANARY: dict[str, Any] = {
    "share": 0.25,
    "window_s": 60.0,
    "max_error_rate": 0.05,
    "max_latency_ratio": 1.5,
    "min_requests": 20,
    "steps": [0.05, 0.25, 1.0],
    "version": "v2",
    "baseline": "v1",
    "started_at": 1700000000.5,
    "by": "k1",
    "step": 1,
    "step_started_at": 1700000300.75,
}
UNSTEPPED_CANARY: dict[str, Any] = {k: v for k, v in STORED_CANARY.items() if k not in ("step", "step_started_at")} | {
    "steps": None,
    "share": 0.1,
}
# As _switch wrote a first activation (nothing was active before), plus the generation the store added.
STORED_ENTRY: dict[str, Any] = {
    "action": "release.promote",
    "from": None,
    "to": "v1",
    "by": "k1",
    "reason": "go",
    "at": 1700000000.25,
    "generation": 1,
}


@pytest.mark.parametrize("stored", [STORED_RELEASE, BARE_RELEASE])
def test_a_release_serializes_to_the_json_stored_before_records_were_typed(stored: dict[str, Any]) -> None:
    record = Release.from_json(orjson.dumps(stored))
    assert orjson.dumps(record.to_dict()) == orjson.dumps(stored)


def test_a_release_reads_with_attributes_down_to_its_pins() -> None:
    record = Release.from_dict(STORED_RELEASE)
    assert record.deployments == ("d1", "d2")
    assert record.checkpoint is not None
    assert record.checkpoint.manifest_digest == "ab" * 32
    assert record.prompt.system_prompt == "You are é/日本"
    assert record.thresholds.min_pass_rate == 0.1 + 0.2
    assert record.smoke is not None
    assert (record.smoke.count, record.smoke.slo_tpot_ms) == (10, None)


def test_a_release_from_before_smoke_runs_and_eval_set_content_loads_with_neither() -> None:
    record = Release.from_json(orjson.dumps(OLDEST_RELEASE))
    assert record.smoke is None
    assert record.eval_set is not None
    assert record.eval_set.content is None
    assert "content" not in record.to_dict()["eval_set"], "the set's path stays what the preflight reads"
    # Its view names the newer pin as null; the stored bytes are never rewritten (releases are immutable).
    assert record.to_dict() == {**OLDEST_RELEASE, "smoke": None}


def test_what_a_store_keeps_for_a_put_is_the_json_it_kept_before() -> None:
    new = release_record.check_put(Release.from_dict(STORED_RELEASE))
    assert new.blob == orjson.dumps(STORED_RELEASE)
    assert (new.model, new.version, new.created_at) == ("m1", "v2", 1700000000.125)


@pytest.mark.parametrize("stored", [STORED_CANARY, UNSTEPPED_CANARY])
def test_a_canary_serializes_to_the_json_stored_before_records_were_typed(stored: dict[str, Any]) -> None:
    canary = Canary.from_json(orjson.dumps(stored))
    assert release_record.check_canary("m1", canary, 3) == orjson.dumps(stored)


def test_a_canary_keeps_its_settings_apart_from_who_started_it() -> None:
    canary = Canary.from_dict(STORED_CANARY)
    assert canary.settings == CanarySettings(0.25, 60.0, 0.05, 1.5, 20, (0.05, 0.25, 1.0))
    assert (canary.version, canary.baseline, canary.step) == ("v2", "v1", 1)
    unstepped = Canary.from_dict(UNSTEPPED_CANARY)
    assert (unstepped.settings.steps, unstepped.step, unstepped.step_started_at) == (None, None, None)


def test_a_canary_from_before_steps_loads_unstepped() -> None:
    before_steps = {k: v for k, v in UNSTEPPED_CANARY.items() if k != "steps"}
    canary = Canary.from_json(orjson.dumps(before_steps))
    assert canary.settings.steps is None
    assert canary.to_dict() == UNSTEPPED_CANARY


def test_a_history_entry_keeps_its_from_key_and_gets_its_generation_from_the_store() -> None:
    entry = HistoryEntry.from_json(orjson.dumps(STORED_ENTRY))
    assert (entry.from_version, entry.to, entry.generation) == (None, "v1", 1)
    assert orjson.dumps(entry.to_dict()) == orjson.dumps(STORED_ENTRY)
    given = HistoryEntry("release.rollback", "v2", "v1", "k1", "bad", at=5.5)
    stored = release_record.check_activation("m1", "v1", 6, given)
    assert orjson.loads(stored) == {
        "action": "release.rollback",
        "from": "v2",
        "to": "v1",
        "by": "k1",
        "reason": "bad",
        "at": 5.5,
        "generation": 7,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", None),
        ("deployments", "d1"),
        ("created_at", "yesterday"),
        ("prompt", None),
        ("checkpoint", {"version": "ft@1", "path": 7}),
        ("thresholds", {"min_pass_rate": "high"}),
        ("smoke", {"samples": "s.jsonl", "count": 1.5}),
    ],
)
def test_a_malformed_stored_release_is_refused_naming_the_field(field: str, value: object) -> None:
    named = {"checkpoint": "path", "thresholds": "min_pass_rate", "smoke": "count"}.get(field, field)
    with pytest.raises(ValueError, match=named):
        Release.from_json(orjson.dumps({**STORED_RELEASE, field: value}))


@pytest.mark.parametrize(
    ("stored", "field", "value"),
    [
        (STORED_CANARY, "share", "most"),
        (STORED_CANARY, "steps", "0.1,1"),
        (STORED_CANARY, "baseline", None),
        (STORED_ENTRY, "to", None),
        (STORED_ENTRY, "generation", "1"),
    ],
)
def test_a_malformed_stored_canary_or_entry_is_refused_naming_the_field(
    stored: dict[str, Any], field: str, value: object
) -> None:
    read = Canary.from_json if stored is STORED_CANARY else HistoryEntry.from_json
    with pytest.raises(ValueError, match=field):
        read(orjson.dumps({**stored, field: value}))
