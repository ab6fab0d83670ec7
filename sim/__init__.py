"""Simulated OpenAI-compatible backend for demos, tests, load tests and failure drills.

Start it with `gateway sim` (or `python -m sim`), or build the ASGI app in-process with
`create_sim_app(SimProfile(...))`.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.app import create_sim_app
    from sim.faults import Faults, parse_faults
    from sim.profile import SimProfile, load_profile

__all__ = ["Faults", "SimProfile", "create_sim_app", "load_profile", "parse_faults"]

_HOMES = MappingProxyType(
    {
        "create_sim_app": "sim.app",
        "Faults": "sim.faults",
        "parse_faults": "sim.faults",
        "SimProfile": "sim.profile",
        "load_profile": "sim.profile",
    }
)


def __getattr__(name: str) -> Any:
    # Imported on first use: `gateway sim --help` needs neither the app nor the pydantic models.
    if name not in _HOMES:
        raise AttributeError(name)
    return getattr(importlib.import_module(_HOMES[name]), name)
