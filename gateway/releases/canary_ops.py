"""Canaries: a share of new requests to a candidate, judged against the active release (canary.py),
ended on a breach (a request the candidate fails is served by the active release, stage.py),
moved up through its steps after clean windows, and promoted at the last one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gateway.core.principal import Limits, Principal, Scope
from gateway.errors import Conflict, GatewayError, InvalidRequest
from gateway.releases.canary import Outcome
from gateway.store.release_record import Canary, CanarySettings, Release

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from gateway.audit.writer import AuditWriter
    from gateway.releases.active import ActiveReleases
    from gateway.releases.canary import CanaryMonitor
    from gateway.releases.preflight import Preflight
    from gateway.routing.router import ModelGroup
    from gateway.store.base import ReleaseStore

log = logging.getLogger(__name__)

# Who moves stepped canaries on, in the audit log and the activation history.
_CANARY_DRIVER = Principal(
    key_id="canary-driver", tenant="*", scopes=frozenset(), models=frozenset(), limits=Limits(), all_tenants=True
)


class CanaryOps:
    """Mixed into ReleaseService (whose store, audit log and monitor they use)."""

    if TYPE_CHECKING:  # what ReleaseService provides
        _store: ReleaseStore
        _audit: AuditWriter
        _clock: Callable[[], float]
        _aborting: set[str]
        active: ActiveReleases
        canary_monitor: CanaryMonitor
        on_canary_abort: Callable[[str, str], None] | None

        def _group(self, model: str) -> ModelGroup: ...
        async def release(self, model: str, version: str) -> Release: ...
        async def refresh(self, model: str) -> None: ...

        preflight: Preflight

        async def _checked(
            self,
            actor: Principal,
            action: str,
            record: Release,
            preflight: Coroutine[Any, Any, dict[str, str | None]],
        ) -> dict[str, str | None]: ...
        async def _switch(
            self,
            actor: Principal,
            model: str,
            version: str,
            action: str,
            reason: str,
            serving: dict[str, str | None] | None = None,
        ) -> dict[str, Any]: ...
        async def _record(
            self,
            actor: Principal,
            action: str,
            model: str,
            before: str | None,
            after: str,
            reason: str,
            *,
            field: str = "active",
            serving: dict[str, str | None] | None = None,
        ) -> None: ...

    def observe(self, model: str, outcome: Outcome) -> None:
        """One finished request; ends the canary (once) when its candidate breaches a threshold."""
        self.canary_monitor.observe(model, outcome)
        canary = self.active.canaries.get(model)
        if canary is None or model in self._aborting:
            return
        breach = self.canary_monitor.breach(model, canary.settings)
        if breach:
            self._aborting.add(model)
            task = asyncio.get_running_loop().create_task(self._abort(model, breach))
            task.add_done_callback(lambda _: self._aborting.discard(model))

    async def _abort(self, model: str, breach: str) -> None:
        try:
            ended = await self.end_canary("canary-monitor", model, f"automatic rollback: {breach}")
        except GatewayError as error:  # store down or racing switch: the next request tries again
            log.warning("could not end the canary of %s: %s", model, error.message)
            return
        if ended["changed"]:
            log.warning("canary %s of %s ended automatically: %s", ended["version"], model, breach)
            if self.on_canary_abort is not None:
                self.on_canary_abort(model, ended["version"])

    # --- records ------------------------------------------------------------------------------

    async def start_canary(
        self, actor: Principal, model: str, version: str, settings: CanarySettings
    ) -> dict[str, Any]:
        """Send `settings.share` of new requests to `version` after the same preflight as a promotion."""
        actor.require(Scope.ADMIN)
        record = await self.release(model, version)
        active, generation = await self._store.release_active(model)
        if active is None or active == version:
            raise InvalidRequest(f"a canary needs an active release other than {version}", param="version")
        await self._checked(actor, "release.canary.start", record, self.preflight(record, run_evals=True, actor=actor))
        now = self._clock()
        canary = Canary(settings, version, baseline=active, started_at=now, by=actor.key_id)
        if settings.steps:
            canary = replace(canary, step=0, step_started_at=now)
        won, new_generation = await self._store.release_set_canary(model, canary, generation)
        if not won:
            raise Conflict(f"{model}: the active release changed; try again")
        self.canary_monitor.reset(model)
        await self.refresh(model)
        reason = str(settings.to_dict())  # the settings as the operator sent them
        await self._record(actor, "release.canary.start", model, active, version, reason, field="canary")
        return {"model": model, "canary": canary.to_dict(), "generation": new_generation}

    async def canary_status(self, model: str) -> dict[str, Any]:
        self._group(model)
        canary = await self._store.release_canary(model)
        stats = self.canary_monitor.stats(model, canary.settings) if canary else None
        view = None if canary is None else canary.to_dict()
        return {"model": model, "canary": view, "stats": stats, "replica_view": "this replica's requests only"}

    async def advance_canaries(self) -> None:
        """Move each stepped canary whose current step passed a clean window up one step; the last
        step promotes. Called by every replica's watcher; the store's compare-and-set picks one."""
        for model, canary in list(self.active.canaries.items()):
            settings = canary.settings
            if not settings.steps or canary.step_started_at is None or model in self._aborting:
                continue
            step_started = canary.step_started_at
            if self._clock() - step_started < settings.window_s:
                continue
            # The monitor's clock is monotonic; the window's start is wall time: compare ages.
            seen_since = time.monotonic() - (self._clock() - step_started)
            if self.canary_monitor.candidate_requests(model, seen_since) < settings.min_requests:
                continue
            try:
                await self._next_step(model, canary)
            except GatewayError as error:  # store down or a racing switch: the next poll looks again
                log.warning("could not move the canary of %s on: %s", model, error.message)

    async def _next_step(self, model: str, canary: Canary) -> None:
        settings = canary.settings
        steps, step = settings.steps or (), (canary.step or 0) + 1
        _, generation = await self._store.release_active(model)
        if step >= len(steps) or float(steps[step]) >= 1.0:
            reason = f"canary passed every step ({', '.join(f'{float(s):g}' for s in steps)})"
            await self._switch(_CANARY_DRIVER, model, canary.version, "release.canary.promote", reason)
            return
        moved_settings = replace(settings, share=float(steps[step]))
        moved = replace(canary, settings=moved_settings, step=step, step_started_at=self._clock())
        won, _ = await self._store.release_set_canary(model, moved, generation)
        if won:
            await self.refresh(model)
            await self._audit.submit(
                {
                    "kind": "admin",
                    "action": "release.canary.step",
                    "actor": _CANARY_DRIVER.key_id,
                    "tenant": None,
                    "target": f"{model}@{canary.version}",
                    "before": {"canary": canary.version, "share": settings.share},
                    "after": {"canary": canary.version, "share": moved_settings.share},
                    "reason": f"a clean {float(settings.window_s):g}s window at {float(settings.share):g}",
                }
            )

    async def end_canary(self, actor_key_id: str, model: str, reason: str) -> dict[str, Any]:
        """Stop sending traffic to the candidate (an automatic rollback when a threshold was breached)."""
        for _ in range(5):
            canary = await self._store.release_canary(model)
            if canary is None:
                return {"model": model, "canary": None, "changed": False}
            _, generation = await self._store.release_active(model)
            won, _ = await self._store.release_set_canary(model, None, generation)
            if won:
                await self.refresh(model)
                await self._audit.submit({"kind": "admin", "action": "release.canary.rollback", "actor": actor_key_id,
                                          "tenant": None, "target": f"{model}@{canary.version}",
                                          "before": {"canary": canary.version}, "after": {"canary": None},
                                          "reason": reason})  # fmt: skip
                return {"model": model, "canary": None, "changed": True, "reason": reason, "version": canary.version}
        raise Conflict(f"{model}: the release keeps changing; try again")
