"""The sim's configuration: timing, faults, seed and advertised models, optionally from YAML."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.faults import FaultError, Faults, parse_fault_fields


class ProfileError(ValueError):
    """A profile file or override that cannot be used; the message names the problem."""


class SimProfile(BaseModel):
    """How a sim process behaves when nothing is overridden at runtime."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_ms: float = Field(default=40.0, ge=0, description="Time to the first token.")
    tpot_ms: float = Field(default=12.0, ge=0, description="Time between later tokens.")
    jitter: float = Field(default=0.1, ge=0, le=1, description="Uniform +/- fraction applied to each delay.")
    faults: Faults = Field(default_factory=Faults, description="Process-wide faults at start and reset.")
    seed: int = Field(default=0, description="Seeds the timing jitter and error-rate draws.")
    echo_tool_results: bool = Field(
        default=False,
        description="Answer a tool result by quoting it (agent demos and tests), instead of generated words.",
    )
    model_ids: list[str] = Field(
        default_factory=lambda: ["sim-model"],
        min_length=1,
        description="Models listed by /v1/models; requests for any other name are still answered.",
    )
    served_root: str | None = Field(
        default=None,
        description="Reported as each model's `root` by /v1/models, as vLLM reports the weights it loaded.",
    )


def load_profile(path: Path | None = None, **overrides: Any) -> SimProfile:
    """Read a YAML profile (or start from defaults) and apply overrides on top.

    Overrides set to None are ignored, so CLI options that were not given keep the file's value.
    A `faults` override may be a `Faults`, which replaces the file's faults, or a mapping or a
    header-syntax string (`status=503,retry_after=1`), whose fields are merged over the file's.
    """
    data = _read_yaml(path) if path is not None else {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "faults" and not isinstance(value, Faults):
            value = _merge_faults(data.get("faults"), value)
        data[key] = value
    try:
        return SimProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"invalid sim profile{f' {path}' if path else ''}: {exc}") from exc


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"cannot read sim profile {path}: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ProfileError(f"sim profile {path} must be a mapping at the top level")
    return loaded


def _merge_faults(base: object, override: object) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    if isinstance(base, Faults):
        merged.update(base.as_dict())
    elif isinstance(base, Mapping):
        merged.update(base)
    if isinstance(override, str):
        try:
            override = parse_fault_fields(override)
        except FaultError as exc:
            raise ProfileError(str(exc)) from exc
    if not isinstance(override, Mapping):
        raise ProfileError("faults override must be a Faults, a mapping or a fault string")
    merged.update(override)
    return merged
