"""Orderings of a model's usable deployments; the router tries them front to back.

Every strategy sees only deployments that may take traffic now, and the router puts degraded
and last-resort ones behind the rest whatever the strategy says.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from gateway.routing.deployment import Deployment
from gateway.settings import Strategy

Order = Callable[[Sequence[Deployment], random.Random], list[Deployment]]


def _weighted_shuffle(deployments: Sequence[Deployment], rng: random.Random) -> list[Deployment]:
    # Efraimidis-Spirakis: sorting by u^(1/w) draws without replacement proportionally to weight.
    return sorted(deployments, key=lambda d: rng.random() ** (1.0 / d.settings.weight), reverse=True)


def priority(deployments: Sequence[Deployment], rng: random.Random) -> list[Deployment]:
    shuffled = _weighted_shuffle(deployments, rng)
    return sorted(shuffled, key=lambda d: d.settings.priority)  # stable: weights break ties


def weighted(deployments: Sequence[Deployment], rng: random.Random) -> list[Deployment]:
    return _weighted_shuffle(deployments, rng)


def least_inflight(deployments: Sequence[Deployment], rng: random.Random) -> list[Deployment]:
    shuffled = list(deployments)
    rng.shuffle(shuffled)
    return sorted(shuffled, key=lambda d: d.inflight / d.settings.max_inflight)


def lowest_latency(deployments: Sequence[Deployment], rng: random.Random) -> list[Deployment]:
    # An unmeasured deployment sorts first so that it gets measured.
    shuffled = list(deployments)
    rng.shuffle(shuffled)
    return sorted(shuffled, key=lambda d: d.stats.ttft.value or 0.0)


STRATEGIES: dict[Strategy, Order] = {
    Strategy.PRIORITY: priority,
    Strategy.WEIGHTED: weighted,
    Strategy.LEAST_INFLIGHT: least_inflight,
    Strategy.LOWEST_LATENCY: lowest_latency,
}
