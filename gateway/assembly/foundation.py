"""What every feature stands on: telemetry, the store, the deployments and their health, the
audit log, and the watch on the store's epoch (a wiped store is noticed and said)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from gateway.assembly.lifecycle import Part, background, closed_at_exit, started
from gateway.audit.writer import AuditWriter
from gateway.backends.factory import build_backend
from gateway.routing.breaker import BreakerState
from gateway.routing.deployment import Deployment
from gateway.routing.health import HealthMonitor
from gateway.routing.router import ModelGroup, Router
from gateway.routing.strategies import STRATEGIES
from gateway.settings import Settings
from gateway.store.base import Store
from gateway.store.factory import open_store
from gateway.store_epoch import StoreEpoch
from gateway.telemetry.providers import Telemetry, breaker_changed


def build_router(
    settings: Settings,
    rng: random.Random | None = None,
    on_breaker_change: Callable[[str, BreakerState], None] | None = None,
) -> Router:
    groups = {}
    for model in settings.models:
        deployments = [
            Deployment(d, build_backend(d), settings.routing, on_breaker_change=on_breaker_change)
            for d in model.deployments
        ]
        order = STRATEGIES[model.strategy or settings.routing.strategy]
        groups[model.name] = ModelGroup(model.name, deployments, order, settings.routing)
    return Router(groups, settings.routing, rng=rng)


def build_audit_writer(settings: Settings, store: Store) -> AuditWriter:
    audit = settings.audit
    return AuditWriter(
        store,
        queue_size=audit.queue_size,
        batch_size=audit.batch_size,
        flush_interval_s=audit.flush_interval_s,
        hmac_key=audit.hmac_key.encode(),
        reserve_wait_s=audit.reserve_wait_s,
        stuck_after_s=audit.stuck_after_s,
        shutdown_wait_s=audit.shutdown_wait_s,
    )


@dataclass(frozen=True, slots=True)
class Foundation:
    telemetry: Telemetry
    store: Store
    router: Router
    deployments: list[Deployment]
    health: HealthMonitor
    audit: AuditWriter
    epoch: StoreEpoch
    part: Part


def build_foundation(settings: Settings, telemetry: Telemetry) -> Foundation:
    store = open_store(settings.store)
    router = build_router(settings, on_breaker_change=breaker_changed)
    deployments = [d for group in router.groups.values() for d in group.deployments]
    health = HealthMonitor(deployments, settings.routing.health)
    audit = build_audit_writer(settings, store)
    epoch = StoreEpoch(store, audit)
    telemetry.watch_audit(audit)

    async def close_backends() -> None:
        for deployment in deployments:
            await deployment.backend.aclose()

    running = (
        # Stopped in reverse: telemetry last, so it flushes the spans of everything above.
        closed_at_exit(lambda: asyncio.to_thread(telemetry.shutdown)),
        closed_at_exit(store.aclose),
        closed_at_exit(close_backends),
        started(audit.start, audit.stop),  # stops after what may still write records
        started(health.start, health.stop),
        background(epoch.run, "store-epoch"),
    )
    return Foundation(telemetry, store, router, deployments, health, audit, epoch, Part(running=running))
