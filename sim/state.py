"""Per-app mutable state of the sim: current faults, counters and the seeded random sources."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.faults import Faults
from sim.profile import SimProfile


@dataclass(slots=True)
class Counters:
    """What the sim has done since start or the last reset; read through GET /sim/control."""

    requests: int = 0
    in_flight: int = 0
    completed: int = 0
    client_disconnects: int = 0
    health_checks: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    faults_fired: dict[str, int] = field(default_factory=dict)


class SimState:
    """Everything a running sim app mutates; one instance per app, kept in `app.state.sim`."""

    def __init__(self, profile: SimProfile) -> None:
        self.profile = profile
        self.faults: Faults = profile.faults
        self.counters = Counters()
        self._jitter_rng = random.Random()
        self._fault_rng = random.Random()
        self._seed_rngs()

    def _seed_rngs(self) -> None:
        # Separate streams so that enabling error_rate does not shift the jitter sequence.
        self._jitter_rng.seed(f"{self.profile.seed}:jitter")
        self._fault_rng.seed(f"{self.profile.seed}:faults")

    def reset(self) -> None:
        """Back to the profile's faults, zero counters and the initial random sequences."""
        self.faults = self.profile.faults
        # In-flight responses still finish and decrement, so their count must survive the reset.
        self.counters = Counters(in_flight=self.counters.in_flight)
        self._seed_rngs()

    def delay(self, base_ms: float, slow: float) -> float:
        """Seconds to wait for a delay of `base_ms`, scaled by `slow` and jittered."""
        jitter = self.profile.jitter
        factor = 1.0 + self._jitter_rng.uniform(-jitter, jitter) if jitter else 1.0
        return base_ms * slow * factor / 1000.0

    def first_token_delay(self, slow: float) -> float:
        return self.delay(self.profile.ttft_ms, slow)

    def token_delay(self, slow: float) -> float:
        return self.delay(self.profile.tpot_ms, slow)

    def roll_error(self, rate: float) -> bool:
        """Whether this request is one of the random failures of `error_rate`."""
        return rate > 0 and self._fault_rng.random() < rate

    def record_status(self, status: int) -> None:
        key = str(status)
        self.counters.by_status[key] = self.counters.by_status.get(key, 0) + 1

    def record_fault(self, name: str) -> None:
        """Count a fault that actually fired (a positional fault past the reply's end never does)."""
        fired = self.counters.faults_fired
        fired[name] = fired.get(name, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "faults": self.faults.as_dict(),
            "counters": asdict(self.counters),
            "profile": self.profile.model_dump(mode="json"),
        }
