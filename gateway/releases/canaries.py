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
from gateway.releases.canary import CanaryMonitor, Outcome
from gateway.store.release_record import Canary, CanarySettings

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.audit.writer import AuditWriter
    from gateway.releases.preflight import Preflight
    from gateway.releases.switching import Switchboard
    from gateway.store.base import ReleaseStore

log = logging.getLogger(__name__)

# Who moves stepped canaries on, in the audit log and the activation history.
_CANARY_DRIVER = Principal(
    key_id="canary-driver", tenant="*", scopes=frozenset(), models=frozenset(), limits=Limits(), all_tenants=True
)


class Canaries:
    """The canaries of every model: started after a promotion's preflight, judged on each finished
    request (`observe`), moved up their steps (`advance`, by every replica's watcher), ended by an
    operator or on a breach. They switch through the same switchboard as a promotion."""

    def __init__(
        self,
        store: ReleaseStore,
        audit: AuditWriter,
        board: Switchboard,
        preflight: Preflight,
        clock: Callable[[], float],
        on_abort: Callable[[str, str], None] | None = None,
    ) -> None:
        """`on_abort` is told (model, version) of each automatic abort: the metrics count them."""
        self._store = store
        self._audit = audit
        self._board = board
        self._preflight = preflight
        self._clock = clock
        self._on_abort = on_abort
        self.monitor = CanaryMonitor()
        self._aborting: set[str] = set()

    def observe(self, model: str, outcome: Outcome) -> None:
        """One finished request; ends the canary (once) when its candidate breaches a threshold."""
        self.monitor.observe(model, outcome)
        canary = self._board.active.canaries.get(model)
        if canary is None or model in self._aborting:
            return
        breach = self.monitor.breach(model, canary.settings)
        if breach:
            self._aborting.add(model)
            task = asyncio.get_running_loop().create_task(self._abort(model, breach))
            task.add_done_callback(lambda _: self._aborting.discard(model))

    async def _abort(self, model: str, breach: str) -> None:
        try:
            ended = await self.end("canary-monitor", model, f"automatic rollback: {breach}")
        except GatewayError as error:  # store down or racing switch: the next request tries again
            log.warning("could not end the canary of %s: %s", model, error.message)
            return
        if ended["changed"]:
            log.warning("canary %s of %s ended automatically: %s", ended["version"], model, breach)
            if self._on_abort is not None:
                self._on_abort(model, ended["version"])

    # --- records ------------------------------------------------------------------------------

    async def start(self, actor: Principal, model: str, version: str, settings: CanarySettings) -> dict[str, Any]:
        """Send `settings.share` of new requests to `version` after the same preflight as a promotion."""
        actor.require(Scope.ADMIN)
        record = await self._board.release(model, version)
        active, generation = await self._store.release_active(model)
        if active is None or active == version:
            raise InvalidRequest(f"a canary needs an active release other than {version}", param="version")
        await self._board.checked(
            actor, "release.canary.start", record, self._preflight(record, run_evals=True, actor=actor)
        )
        now = self._clock()
        canary = Canary(settings, version, baseline=active, started_at=now, by=actor.key_id)
        if settings.steps:
            canary = replace(canary, step=0, step_started_at=now)
        won, new_generation = await self._store.release_set_canary(model, canary, generation)
        if not won:
            raise Conflict(f"{model}: the active release changed; try again")
        self.monitor.reset(model)
        await self._board.refresh(model)
        reason = str(settings.to_dict())  # the settings as the operator sent them
        await self._board.record(actor, "release.canary.start", model, active, version, reason, field="canary")
        return {"model": model, "canary": canary.to_dict(), "generation": new_generation}

    async def status(self, model: str) -> dict[str, Any]:
        self._board.group(model)
        canary = await self._store.release_canary(model)
        stats = self.monitor.stats(model, canary.settings) if canary else None
        view = None if canary is None else canary.to_dict()
        return {"model": model, "canary": view, "stats": stats, "replica_view": "this replica's requests only"}

    async def advance(self) -> None:
        """Move each stepped canary whose current step passed a clean window up one step; the last
        step promotes. Called by every replica's watcher; the store's compare-and-set picks one."""
        for model, canary in list(self._board.active.canaries.items()):
            settings = canary.settings
            if not settings.steps or canary.step_started_at is None or model in self._aborting:
                continue
            step_started = canary.step_started_at
            if self._clock() - step_started < settings.window_s:
                continue
            # The monitor's clock is monotonic; the window's start is wall time: compare ages.
            seen_since = time.monotonic() - (self._clock() - step_started)
            if self.monitor.candidate_requests(model, seen_since) < settings.min_requests:
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
            await self._board.switch(_CANARY_DRIVER, model, canary.version, "release.canary.promote", reason)
            return
        moved_settings = replace(settings, share=float(steps[step]))
        moved = replace(canary, settings=moved_settings, step=step, step_started_at=self._clock())
        won, _ = await self._store.release_set_canary(model, moved, generation)
        if won:
            await self._board.refresh(model)
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

    async def end(self, actor_key_id: str, model: str, reason: str) -> dict[str, Any]:
        """Stop sending traffic to the candidate (an automatic rollback when a threshold was breached)."""
        for _ in range(5):
            canary = await self._store.release_canary(model)
            if canary is None:
                return {"model": model, "canary": None, "changed": False}
            _, generation = await self._store.release_active(model)
            won, _ = await self._store.release_set_canary(model, None, generation)
            if won:
                await self._board.refresh(model)
                await self._audit.submit({"kind": "admin", "action": "release.canary.rollback", "actor": actor_key_id,
                                          "tenant": None, "target": f"{model}@{canary.version}",
                                          "before": {"canary": canary.version}, "after": {"canary": None},
                                          "reason": reason})  # fmt: skip
                return {"model": model, "canary": None, "changed": True, "reason": reason, "version": canary.version}
        raise Conflict(f"{model}: the release keeps changing; try again")
