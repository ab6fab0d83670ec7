"""One test per edge of a deployment's routing state machine (drawn in docs/architecture.md,
"Deployment states"). The clock is a test clock; the statistics, breaker, probes and cool-down
are the real ones."""

from __future__ import annotations

from gateway.routing.deployment import Availability, Deployment
from gateway.routing.router import ModelGroup
from gateway.routing.strategies import priority
from gateway.settings import DeploymentSettings, RoutingSettings
from tests.doubles import Script, ScriptedBackend

ROUTING = RoutingSettings.model_validate(
    {
        "breaker": {"failure_threshold": 3, "cooldown_s": 10},
        "slow": {"factor": 1.4, "alpha": 0.5, "min_samples": 3, "cooldown_s": 30},
        "health": {"unhealthy_after": 2},
    }
)
FAST, SLOW = (0.2, 0.02), (0.6, 0.06)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def deployments(clock: Clock, count: int = 2, max_inflight: int = 256) -> list[Deployment]:
    return [
        Deployment(
            DeploymentSettings(
                name=f"d{i}", api_base="http://127.0.0.1:9/v1", model="m", priority=i, max_inflight=max_inflight
            ),
            ScriptedBackend(f"d{i}", Script()),
            ROUTING,
            clock=clock,
        )
        for i in range(count)
    ]


def feed(group: ModelGroup, deployment: Deployment, sample: tuple[float, float], times: int) -> None:
    for _ in range(times):
        group.record_latency(deployment, *sample)


# --- ready <-> degraded (slow detection) ------------------------------------------------------
def test_ready_to_degraded_when_slower_than_its_peers() -> None:
    clock = Clock()
    a, b = deployments(clock)
    group = ModelGroup("m", [a, b], priority, ROUTING)
    feed(group, b, FAST, 3)
    feed(group, a, SLOW, 3)
    assert a.availability() is Availability.DEGRADED
    assert b.availability() is Availability.READY


def test_ready_to_degraded_when_slower_than_its_own_baseline_with_idle_peers() -> None:
    clock = Clock()
    a, b = deployments(clock)
    group = ModelGroup("m", [a, b], priority, ROUTING)
    feed(group, a, FAST, 10)
    assert a.availability() is Availability.READY
    feed(group, a, SLOW, 3)
    assert a.availability() is Availability.DEGRADED


def test_degraded_to_ready_when_the_cooldown_passes_even_without_traffic() -> None:
    """The 118 s case: when the cooldown ended, a peer's finished request re-ran detection on
    the degraded deployment's stale numbers (reset only when a request was planned) and
    degraded it again, cooldown after cooldown, without it serving anything."""
    clock = Clock()
    a, b = deployments(clock)
    group = ModelGroup("m", [a, b], priority, ROUTING)
    feed(group, b, FAST, 3)
    feed(group, a, SLOW, 3)
    assert a.availability() is Availability.DEGRADED
    clock.now = 30.0
    feed(group, b, FAST, 1)  # the peer finishes a request before anything is planned
    assert a.availability() is Availability.READY
    assert a.stats.ttft.samples == 0  # measured afresh from here


def test_back_from_degraded_and_still_slow_is_degraded_again_after_min_samples() -> None:
    clock = Clock()
    a, b = deployments(clock)
    group = ModelGroup("m", [a, b], priority, ROUTING)
    feed(group, a, FAST, 10)
    feed(group, a, SLOW, 3)
    clock.now = 30.0
    assert a.availability() is Availability.READY
    feed(group, a, SLOW, 2)
    assert a.availability() is Availability.READY  # fewer than min_samples: not judged yet
    feed(group, a, SLOW, 1)
    assert a.availability() is Availability.DEGRADED


# --- breaker: closed -> open -> half-open -> closed | open ----------------------------------
def test_ready_to_open_after_consecutive_failures() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1)
    for _ in range(3):
        a.breaker.record_failure()
    assert a.availability() is Availability.OPEN


def test_open_to_half_open_after_the_breaker_cooldown_lets_one_trial_through() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1)
    for _ in range(3):
        a.breaker.record_failure()
    clock.now = 10.0
    assert a.availability() is Availability.READY  # half-open: one trial may go
    assert a.breaker.acquire()
    assert a.availability() is Availability.OPEN  # the trial is out: nothing else


def test_half_open_to_closed_when_the_trial_succeeds() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1)
    for _ in range(3):
        a.breaker.record_failure()
    clock.now = 10.0
    assert a.breaker.acquire()
    a.breaker.record_success()
    assert a.availability() is Availability.READY
    assert a.breaker.acquire()
    assert a.breaker.acquire()  # closed: no limit on trials


def test_half_open_to_open_when_the_trial_fails() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1)
    for _ in range(3):
        a.breaker.record_failure()
    clock.now = 10.0
    assert a.breaker.acquire()
    a.breaker.record_failure()
    assert a.availability() is Availability.OPEN
    clock.now = 19.9
    assert a.availability() is Availability.OPEN  # a full cooldown from the failed trial


def test_half_open_trial_abandoned_by_the_client_frees_the_trial() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1)
    for _ in range(3):
        a.breaker.record_failure()
    clock.now = 10.0
    assert a.breaker.acquire()
    a.breaker.release()
    assert a.availability() is Availability.READY
    assert a.breaker.acquire()


# --- probes: ready <-> unhealthy ------------------------------------------------------------
def test_ready_to_unhealthy_after_consecutive_failed_probes_and_back_on_one_good_probe() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1)
    a.record_probe(False, ROUTING.health.unhealthy_after)
    assert a.availability() is Availability.READY
    a.record_probe(False, ROUTING.health.unhealthy_after)
    assert a.availability() is Availability.UNHEALTHY
    a.record_probe(True, ROUTING.health.unhealthy_after)
    assert a.availability() is Availability.READY


# --- 429 with Retry-After: ready <-> cooling ------------------------------------------------
def test_ready_to_cooling_on_retry_after_and_back_when_it_passes() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1)
    a.cool_down(5)
    assert a.availability() is Availability.COOLING
    clock.now = 5.0
    assert a.availability() is Availability.READY


# --- max_inflight: any -> full -> back ------------------------------------------------------
def test_full_at_max_inflight_whatever_else_and_back_below_it() -> None:
    clock = Clock()
    (a,) = deployments(clock, 1, max_inflight=2)
    a.cool_down(5)
    a.inflight = 2
    assert a.availability() is Availability.FULL
    a.inflight = 1
    assert a.availability() is Availability.COOLING


def test_precedence_full_open_unhealthy_cooling_degraded_ready() -> None:
    clock = Clock()
    a, b = deployments(clock, max_inflight=1)
    group = ModelGroup("m", [a, b], priority, ROUTING)
    feed(group, a, FAST, 10)
    feed(group, a, SLOW, 3)
    assert a.availability() is Availability.DEGRADED
    a.cool_down(5)
    assert a.availability() is Availability.COOLING
    a.record_probe(False, 1)
    assert a.availability() is Availability.UNHEALTHY
    for _ in range(3):
        a.breaker.record_failure()
    assert a.availability() is Availability.OPEN
    a.inflight = 1
    assert a.availability() is Availability.FULL
