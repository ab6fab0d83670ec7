"""What both stores share about model releases: the records that cross the seam, the checks made
before anything is touched (bad arguments fail the same way, ValueError, everywhere) and the
history cap.

`Release`, `Canary` and `HistoryEntry` serialize to the JSON the stores kept before records were
typed - the same keys in the same order - so existing data loads and what is written now is what
was written then. Both stores read them back through `from_json`, the one place a stored record is
checked. A release is kept byte for byte as put and never changed. An activation history entry is
kept as given plus the generation it produced; the caller's `expected_generation + 1` is that
generation whenever the activation wins, so the entry is encoded before the store is asked and no
store re-encodes JSON.

Records from before a field existed still load: a release without a smoke pin, an eval-set pin
without the set's content (the preflight then reads the set from its path), a canary without steps.
Their views show the newer keys as null; nothing stored is rewritten.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

import orjson

from gateway.store import fields

# Activation history entries kept per model (the oldest are dropped beyond this).
HISTORY_CAP = 1000

_RELEASE = "a release"
_CANARY = "a canary"
_ENTRY = "an activation history entry"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CheckpointPin:
    """The registry version a release serves, and its manifest's digest when it was pinned."""

    version: str
    path: str
    manifest_digest: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CheckpointPin:
        what = "a release's checkpoint"
        text = fields.text
        return cls(text(raw, "version", what), text(raw, "path", what), text(raw, "manifest_digest", what))


@dataclass(frozen=True, slots=True)
class PromptPin:
    """The system prompt a release puts in front of every request ("" for none)."""

    version: str
    system_prompt: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PromptPin:
        what = "a release's prompt"
        text = fields.text
        return cls(text(raw, "version", what), text(raw, "system_prompt", what), text(raw, "sha256", what))


@dataclass(frozen=True, slots=True)
class EvalSetPin:
    """The eval set a promotion must pass, pinned by content (`content`: the set's canonical JSON;
    None in releases made before sets were pinned by content, absent from their JSON)."""

    id: str
    version: str
    digest: str
    path: str
    content: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return fields.without_none(asdict(self), ("content",))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EvalSetPin:
        what, text = "a release's eval set", fields.text
        return cls(
            id=text(raw, "id", what),
            version=text(raw, "version", what),
            digest=text(raw, "digest", what),
            path=text(raw, "path", what),
            content=fields.optional_text(raw, "content", what),
        )


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_pass_rate: float | None = None  # None: the eval set's own threshold

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Thresholds:
        return cls(fields.optional_number(raw, "min_pass_rate", "a release's thresholds"))


@dataclass(frozen=True, slots=True)
class SmokePin:
    """A replay smoke run the preflight makes: samples, how many, and the bar it must meet."""

    samples: str
    count: int
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    min_goodput: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SmokePin:
        what = "a release's smoke run"
        return cls(
            samples=fields.text(raw, "samples", what),
            count=fields.integer(raw, "count", what),
            slo_ttft_ms=fields.optional_number(raw, "slo_ttft_ms", what),
            slo_tpot_ms=fields.optional_number(raw, "slo_tpot_ms", what),
            min_goodput=fields.number(raw, "min_goodput", what, 1.0),
        )


@dataclass(frozen=True, slots=True)
class Release:
    """An immutable release of a logical model: what serves it and what it must pass first."""

    model: str
    version: str
    deployments: tuple[str, ...]
    prompt: PromptPin
    created_at: float
    author: str = ""  # the key that created it
    checkpoint: CheckpointPin | None = None
    eval_set: EvalSetPin | None = None
    thresholds: Thresholds = Thresholds()
    smoke: SmokePin | None = None
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        """In the key order releases were always stored in; unset pins are null, not absent."""
        return {
            "model": self.model,
            "version": self.version,
            "deployments": list(self.deployments),
            "checkpoint": None if self.checkpoint is None else self.checkpoint.to_dict(),
            "prompt": self.prompt.to_dict(),
            "eval_set": None if self.eval_set is None else self.eval_set.to_dict(),
            "thresholds": self.thresholds.to_dict(),
            "smoke": None if self.smoke is None else self.smoke.to_dict(),
            "notes": self.notes,
            "author": self.author,
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, raw: bytes | str) -> Release:
        return cls.from_dict(fields.json_object(orjson.loads(raw), "a stored release"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Release:
        """Checked field by field (ValueError naming the field); unknown fields are ignored."""
        return cls(
            model=fields.text(raw, "model", _RELEASE),
            version=fields.text(raw, "version", _RELEASE),
            deployments=fields.names(raw, "deployments", _RELEASE),
            prompt=PromptPin.from_dict(fields.json_object(raw.get("prompt"), "a release's prompt")),
            created_at=fields.number(raw, "created_at", _RELEASE),
            author=fields.text(raw, "author", _RELEASE),
            checkpoint=_pin(raw, "checkpoint", CheckpointPin.from_dict),
            eval_set=_pin(raw, "eval_set", EvalSetPin.from_dict),
            thresholds=Thresholds.from_dict(fields.json_object(raw.get("thresholds"), "a release's thresholds")),
            smoke=_pin(raw, "smoke", SmokePin.from_dict),
            notes=fields.text(raw, "notes", _RELEASE),
        )


def _pin(raw: dict[str, Any], name: str, read: Callable[[dict[str, Any]], T]) -> T | None:
    value = raw.get(name)
    return None if value is None else read(fields.json_object(value, f"a release's {name}"))


@dataclass(frozen=True, slots=True)
class CanarySettings:
    """What an operator chose for a canary (the admin API has the defaults and the bounds)."""

    share: float  # of new requests sent to the candidate (a stepped canary's current step)
    window_s: float
    max_error_rate: float
    max_latency_ratio: float  # candidate TTFT/TPOT median over the active release's
    min_requests: int = 20  # per side, before judging
    steps: tuple[float, ...] | None = None  # rising shares; the last promotes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "steps": None if self.steps is None else list(self.steps)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CanarySettings:
        return cls(
            share=fields.number(raw, "share", _CANARY),
            window_s=fields.number(raw, "window_s", _CANARY),
            max_error_rate=fields.number(raw, "max_error_rate", _CANARY),
            max_latency_ratio=fields.number(raw, "max_latency_ratio", _CANARY),
            min_requests=fields.integer(raw, "min_requests", _CANARY, 20),
            steps=_shares(raw.get("steps")),
        )


def _shares(steps: object) -> tuple[float, ...] | None:
    if steps is None:
        return None
    if not isinstance(steps, list) or not all(isinstance(s, int | float) and not isinstance(s, bool) for s in steps):
        raise ValueError(f"{_CANARY}'s steps must be a list of shares, not {steps!r}")
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class Canary:
    """A model's running canary, shared by every replica: its settings (flat in the JSON object)
    and who started which candidate against which active release."""

    settings: CanarySettings
    version: str  # the candidate
    baseline: str  # the release active when it started
    started_at: float
    by: str
    step: int | None = None  # a stepped canary's index into settings.steps (absent otherwise)
    step_started_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        values = {
            **self.settings.to_dict(),
            "version": self.version,
            "baseline": self.baseline,
            "started_at": self.started_at,
            "by": self.by,
            "step": self.step,
            "step_started_at": self.step_started_at,
        }
        return fields.without_none(values, ("step", "step_started_at"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Canary:
        return cls.from_dict(fields.json_object(orjson.loads(raw), "a stored canary"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Canary:
        step = raw.get("step")
        return cls(
            settings=CanarySettings.from_dict(raw),
            version=fields.text(raw, "version", _CANARY),
            baseline=fields.text(raw, "baseline", _CANARY),
            started_at=fields.number(raw, "started_at", _CANARY),
            by=fields.text(raw, "by", _CANARY),
            step=None if step is None else fields.integer(raw, "step", _CANARY),
            step_started_at=fields.optional_number(raw, "step_started_at", _CANARY),
        )


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One activation: which release went active in place of which, by whom and why."""

    action: str  # "release.promote", "release.rollback" or "release.canary.promote"
    from_version: str | None  # "from" in the JSON: the release active before (None: none was)
    to: str
    by: str
    reason: str
    at: float
    generation: int = 0  # the generation the activation produced: set by the store, 0 until then

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "from": self.from_version,
            "to": self.to,
            "by": self.by,
            "reason": self.reason,
            "at": self.at,
            "generation": self.generation,
        }

    @classmethod
    def from_json(cls, raw: bytes | str) -> HistoryEntry:
        return cls.from_dict(fields.json_object(orjson.loads(raw), "a stored activation history entry"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HistoryEntry:
        return cls(
            action=fields.text(raw, "action", _ENTRY),
            from_version=fields.optional_text(raw, "from", _ENTRY),
            to=fields.text(raw, "to", _ENTRY),
            by=fields.text(raw, "by", _ENTRY),
            reason=fields.text(raw, "reason", _ENTRY),
            at=fields.number(raw, "at", _ENTRY),
            generation=fields.integer(raw, "generation", _ENTRY),
        )


@dataclass(frozen=True, slots=True)
class NewRelease:
    """A checked record for `release_put`: what the stores index, and the JSON they keep."""

    model: str
    version: str
    created_at: float
    blob: bytes


def _json(value: dict[str, Any], what: str) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as error:
        raise ValueError(f"a release {what} must be JSON: {error}") from error


def check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"a release's {what} must be a non-empty string, not {value!r}")
    return value


def check_put(record: Release) -> NewRelease:
    blob = _json(record.to_dict(), "record")
    created_at: object = record.created_at
    if isinstance(created_at, bool) or not isinstance(created_at, int | float) or not math.isfinite(created_at):
        raise ValueError(f"a release's created_at must be a unix time, not {created_at!r}")
    return NewRelease(
        model=check_name(record.model, "model"),
        version=check_name(record.version, "version"),
        created_at=float(created_at),
        blob=blob,
    )


def check_generation(expected_generation: object) -> int:
    if isinstance(expected_generation, bool) or not isinstance(expected_generation, int) or expected_generation < 0:
        raise ValueError(f"an expected generation is an integer >= 0, not {expected_generation!r}")
    return expected_generation


def check_activation(model: str, version: str, expected_generation: int, entry: HistoryEntry) -> bytes:
    """The history entry as stored if the activation wins (the entry with its new generation)."""
    check_name(model, "model")
    check_name(version, "version")
    check_generation(expected_generation)
    return _json(replace(entry, generation=expected_generation + 1).to_dict(), "history entry")


def check_canary(model: str, canary: Canary | None, expected_generation: int) -> bytes | None:
    """The canary's JSON as stored (kept byte for byte, like records), or None to clear it."""
    check_name(model, "model")
    check_generation(expected_generation)
    if canary is not None and not isinstance(canary, Canary):
        raise ValueError(f"a canary must be a Canary record, not {type(canary).__name__}")
    return None if canary is None else _json(canary.to_dict(), "canary")
