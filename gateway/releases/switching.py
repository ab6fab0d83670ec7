"""What every change of a model's release goes through: finding a release, switching the active
one (a compare-and-set on the model's generation in the store, retried while other switches land),
refreshing this replica's view, and the audit records of each change and each refused preflight.
The release service and the canaries both switch through here."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.audit.writer import AuditWriter
from gateway.core.principal import Principal
from gateway.errors import Conflict, NotFound
from gateway.releases.active import ActiveReleases
from gateway.releases.preflight import PreflightFailed, Served
from gateway.routing.router import ModelGroup, Router
from gateway.store.base import ReleaseStore
from gateway.store.release_record import HistoryEntry, Release


class Switchboard:
    def __init__(
        self,
        store: ReleaseStore,
        audit: AuditWriter,
        router: Router,
        active: ActiveReleases,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._audit = audit
        self._router = router
        self.active = active
        self._clock = clock

    async def switch(
        self,
        actor: Principal,
        model: str,
        version: str,
        action: str,
        reason: str,
        serving: dict[str, str | None] | None = None,
    ) -> dict[str, Any]:
        for _ in range(5):  # a lost compare-and-set means another switch landed: look again
            current, generation = await self._store.release_active(model)
            if current == version:
                return {"model": model, "active": version, "generation": generation, "changed": False,
                        "serving": serving}  # fmt: skip
            entry = HistoryEntry(
                action, from_version=current, to=version, by=actor.key_id, reason=reason, at=self._clock()
            )
            won, new_generation = await self._store.release_activate(model, version, generation, entry)
            if won:
                await self.refresh(model)
                await self.record(actor, action, model, current, version, reason, serving=serving)
                return {"model": model, "active": version, "generation": new_generation, "changed": True,
                        "serving": serving}  # fmt: skip
        raise Conflict(f"{model}: the active release keeps changing; try again")

    async def release(self, model: str, version: str) -> Release:
        self.group(model)
        record = await self._store.release_get(model, version)
        if record is None:
            raise NotFound(f"release {model}@{version} not found")
        return record

    def group(self, model: str) -> ModelGroup:
        group = self._router.groups.get(model)
        if group is None:
            raise NotFound(f"model '{model}' not found")
        return group

    async def refresh(self, model: str) -> None:
        version, generation = await self._store.release_active(model)
        record = await self._store.release_get(model, version) if version else None
        if record is None:
            self.active.records.pop(model, None)
        else:
            self.active.records[model] = record
        canary = await self._store.release_canary(model)
        candidate = await self._store.release_get(model, canary.version) if canary else None
        if canary is None or candidate is None:
            self.active.canaries.pop(model, None)
            self.active.canary_records.pop(model, None)
        else:
            self.active.canaries[model], self.active.canary_records[model] = canary, candidate
        self.active.generations[model] = generation

    async def checked(
        self, actor: Principal, action: str, record: Release, preflight: Coroutine[Any, Any, Served]
    ) -> Served:
        """Run the preflight; a refusal is audited (what was refused and why) before it is raised."""
        try:
            return await preflight
        except PreflightFailed as refused:
            await self._audit.submit(
                {
                    "kind": "admin",
                    "action": f"{action}.refused",
                    "actor": actor.key_id,
                    "tenant": None,
                    "target": f"{record.model}@{record.version}",
                    "before": None,
                    "after": None,
                    "reason": refused.message,
                }
            )
            raise

    async def record(
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
    ) -> None:
        """`field`: what changed to `after` - the active release, or only the canary, or nothing
        but a new record ("release")."""
        await self._audit.submit(
            {
                "kind": "admin",
                "action": action,
                "actor": actor.key_id,
                "tenant": None,
                "target": f"{model}@{after}",
                "before": {"active": before} if field != "release" else None,
                "after": {field: after} if serving is None else {field: after, "serving": serving},
                "reason": reason,
            }
        )
