"""The replica staying current: a switch made anywhere reaches it, and its checkpoints are checked.

`ReleaseWatcher` polls the store's generations so that a switch made on any replica (or by the
CLI) reaches this one within `releases.watch_interval_s`. `CheckpointWatch` verifies the active
releases' checkpoints again, so that /readyz reports weights changed or lost under them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from checkpoints.registry import verify
from gateway.errors import GatewayError, StoreCorrupt
from gateway.releases.active import ActiveReleases
from gateway.releases.service import ReleaseService
from gateway.store.base import ReleaseStore
from gateway.store.release_record import CheckpointPin

# The name these logged under in gateway/releases/serving.py: operators filter by it.
log = logging.getLogger("gateway.releases.serving")


class ReleaseWatcher:
    """Polls the store's generations so that a switch made on any replica reaches this one.

    Every replica reads the same records, so whatever one bad record does, it does fleet-wide: a
    model whose record does not decode keeps its last known release (logged once per distinct
    problem, counted by `on_corrupt`) while the other models still follow the store, and the loop
    outlives any error of a poll."""

    def __init__(
        self,
        store: ReleaseStore,
        service: ReleaseService,
        interval_s: float,
        on_corrupt: Callable[[str], None] | None = None,
    ) -> None:
        """`on_corrupt` hears of each newly found malformed record (by model): the metrics count it."""
        self._store = store
        self._service = service
        self._interval_s = interval_s
        self._corrupt: dict[str, str] = {}  # model -> the problem last logged for it
        self.on_corrupt = on_corrupt

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except GatewayError:  # store down: keep serving the last known release
                pass
            except Exception:  # a bug: a dead watcher would hide every later switch, silently
                log.exception("the release watcher's poll failed; next poll in %.1f s", self._interval_s)
            await asyncio.sleep(self._interval_s)

    async def poll(self) -> None:
        generations = await self._store.release_generations()
        for model, generation in generations.items():
            if self._service.switchboard.active.generations.get(model) != generation:
                await self._refresh(model)
        await self._service.canaries.advance()

    async def _refresh(self, model: str) -> None:
        # refresh() sets the generation last: after a StoreCorrupt the next poll tries again, so
        # the model recovers as soon as the record is repaired.
        try:
            await self._service.switchboard.refresh(model)
        except StoreCorrupt as corrupt:
            if self._corrupt.get(model) != corrupt.message:
                self._corrupt[model] = corrupt.message
                kept = self._service.switchboard.active.records.get(model)
                log.error("model %s keeps release %s: %s", model, kept.version if kept else None, corrupt.message)
                if self.on_corrupt is not None:
                    self.on_corrupt(model)
            return
        if self._corrupt.pop(model, None) is not None:
            log.warning("model %s follows the store again: its release records decode", model)


class CheckpointWatch:
    """Verifies each active release's checkpoint again every `interval_s` (hashing runs in a
    thread), so that weights changed or lost under a running release make /readyz say so."""

    def __init__(self, active: ActiveReleases, interval_s: float) -> None:
        self._active = active
        self._interval_s = interval_s

    async def run(self) -> None:
        while True:
            for model, record in list(self._active.records.items()):
                pin = record.checkpoint
                problems = await asyncio.to_thread(_checkpoint_problems, pin) if pin else []
                if self._active.records.get(model) is record:  # not switched meanwhile
                    self._active.checkpoint_problems[model] = problems
            for model in set(self._active.checkpoint_problems) - set(self._active.records):
                del self._active.checkpoint_problems[model]
            await asyncio.sleep(self._interval_s)


def _checkpoint_problems(pin: CheckpointPin) -> list[str]:
    report = verify(Path(pin.path), expected_digest=pin.manifest_digest)
    return [f"checkpoint {pin.version} {problem}" for problem in report.problems]
