"""Model releases: immutable records that pin a checkpoint, deployments, a prompt and an eval set,
and the one active release per logical model.

Promotion runs a preflight (checkpoint manifest verifies, deployments healthy, eval set passes)
before switching. Rollback goes back through the activation history (history.py) or to a named
release, after checking the target the same way, then probes it once more. A switch is a compare-and-set on the model's
generation in the store: concurrent switches are serialized (one wins; a loser whose target is
already active succeeds idempotently), and every replica notices the new generation within its
poll interval (`ReleaseWatcher`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoints.registry import CheckpointRegistry, RegistryError
from gateway.audit.writer import AuditWriter
from gateway.core.principal import Principal, Scope
from gateway.errors import Conflict, InvalidRequest, StoreUnavailable
from gateway.releases.active import ActiveReleases
from gateway.releases.canaries import Canaries
from gateway.releases.candidate import CandidateTraffic
from gateway.releases.history import rollback_target
from gateway.releases.load_hooks import LoadedAdapter, give_back
from gateway.releases.preflight import Preflight, PreflightFailed
from gateway.releases.switching import Switchboard
from gateway.routing.health import HealthMonitor
from gateway.routing.router import Router
from gateway.store.base import ReleaseStore
from gateway.store.release_record import (
    HISTORY_CAP,
    CheckpointPin,
    EvalSetPin,
    PromptPin,
    Release,
    SmokePin,
    Thresholds,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReleaseSpec:
    version: str
    deployments: Sequence[str] = ()  # empty: every deployment of the model
    checkpoint: str | None = None  # a version in the checkpoint registry, e.g. "llama-ft@1200"
    system_prompt: str = ""
    prompt_version: str = ""
    eval_set: str | None = None  # path of an eval set (eval/ package format)
    min_pass_rate: float | None = None  # None: the eval set's own threshold
    smoke_samples: str | None = None  # request samples for a replay smoke run (replay/ formats)
    smoke_count: int = 10
    smoke_slo_ttft_ms: float | None = None
    smoke_slo_tpot_ms: float | None = None
    smoke_min_goodput: float = 1.0
    notes: str = ""


class ReleaseService:
    """Releases made, promoted and rolled back; its collaborators, each built here from the
    constructor's arguments: the switchboard every change goes through, the preflight, and the
    canaries (`canaries`: their operations, for the admin API, the watcher and the stage)."""

    def __init__(
        self,
        store: ReleaseStore,
        audit: AuditWriter,
        router: Router,
        health: HealthMonitor,
        checkpoints: CheckpointRegistry | None,
        active: ActiveReleases,
        candidate: CandidateTraffic | None = None,
        on_canary_abort: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.time,
        run_load_hooks: bool = True,
    ) -> None:
        """`candidate`: eval and smoke traffic through this gateway's own request path (the CLI has
        none); `run_load_hooks`: False in the CLI (a hook starts servers, which belong on the
        gateway's machine); `on_canary_abort` counts automatic canary aborts (model, version)."""
        self._store = store
        self._checkpoints = checkpoints
        self._clock = clock
        self.switchboard = Switchboard(store, audit, router, active, clock)
        self.preflight = Preflight(health, self.switchboard.group, candidate, run_load_hooks)
        self.canaries = Canaries(store, audit, self.switchboard, self.preflight, clock, on_canary_abort)

    async def create(self, actor: Principal, model: str, spec: ReleaseSpec) -> Release:
        actor.require(Scope.ADMIN)
        group = self.switchboard.group(model)
        known = {d.name for d in group.deployments}
        unknown = sorted(set(spec.deployments) - known)
        if unknown:
            raise InvalidRequest(f"model '{model}' has no deployments named {', '.join(unknown)}", param="deployments")
        record = Release(
            model=model,
            version=spec.version,
            deployments=tuple(spec.deployments) or tuple(sorted(known)),
            checkpoint=self._checkpoint_pin(spec.checkpoint),
            prompt=PromptPin(
                version=spec.prompt_version,
                system_prompt=spec.system_prompt,
                sha256=hashlib.sha256(spec.system_prompt.encode()).hexdigest(),
            ),
            eval_set=_eval_pin(spec.eval_set),
            thresholds=Thresholds(min_pass_rate=spec.min_pass_rate),
            smoke=_smoke_pin(spec),
            notes=spec.notes,
            author=actor.key_id,
            created_at=self._clock(),
        )
        if not await self._store.release_put(record):
            raise Conflict(f"release {model}@{spec.version} exists; releases are immutable")
        await self.switchboard.record(actor, "release.create", model, None, spec.version, "", field="release")
        return record

    def _checkpoint_pin(self, version: str | None) -> CheckpointPin | None:
        if version is None:
            return None
        if self._checkpoints is None:
            raise InvalidRequest("releases.checkpoint_registry is not configured", param="checkpoint")
        try:
            entry = self._checkpoints.get(version)
        except RegistryError as error:
            raise InvalidRequest(str(error), param="checkpoint") from None
        return CheckpointPin(version=version, path=entry.path, manifest_digest=entry.manifest_digest)

    async def overview(self, model: str) -> dict[str, Any]:
        """The model's releases, active pointer, canary and recent history, as the views show them."""
        self.switchboard.group(model)
        active, generation = await self._store.release_active(model)
        canary = await self._store.release_canary(model)
        return {
            "model": model,
            "active": active,
            "generation": generation,
            "canary": None if canary is None else canary.to_dict(),
            "releases": [record.to_dict() for record in await self._store.release_list(model)],
            "history": [entry.to_dict() for entry in await self._store.release_history(model, 50)],
            "rollback_target": await self.rollback_target(model),
        }

    # --- switching ----------------------------------------------------------------------------
    async def promote(self, actor: Principal, model: str, version: str, reason: str = "") -> dict[str, Any]:
        actor.require(Scope.ADMIN)
        record = await self.switchboard.release(model, version)
        serving = await self.switchboard.checked(
            actor, "release.promote", record, self.preflight(record, run_evals=True, actor=actor)
        )
        return await self.switchboard.switch(actor, model, version, "release.promote", reason, serving)

    async def rollback(
        self,
        actor: Principal,
        model: str,
        to_version: str | None = None,
        reason: str = "",
        expected_active: str | None = None,
    ) -> dict[str, Any]:
        """`expected_active`: roll back only from that release, so that a repeated request (a double
        click, a retry) cannot roll back a second step."""
        actor.require(Scope.ADMIN)
        if expected_active is not None:
            active, _ = await self._store.release_active(model)
            if active != expected_active:
                raise Conflict(f"{model}: the active release is {active}, not {expected_active}; nothing rolled back")
        target = to_version or await self._previous(model)
        record = await self.switchboard.release(model, target)
        # The old release passed its evals already; its deployments may need bringing back.
        loaded: list[LoadedAdapter] = []
        try:
            preflight = self.preflight(record, run_evals=False, bring_up=True, actor=actor, loaded=loaded)
            serving = await self.switchboard.checked(actor, "release.rollback", record, preflight)
            result = await self.switchboard.switch(actor, model, target, "release.rollback", reason, serving)
        except BaseException as failure:  # a lost switch, a store error, or the caller gone (cancelled)
            if not loaded:
                raise
            # Shielded: a second cancellation must not leave the engines half given back.
            said = await asyncio.shield(self._give_back_unless_switched(model, target, loaded))
            if isinstance(failure, Conflict):
                raise Conflict(f"{failure.message}; {said}") from None
            raise
        try:  # verified after the switch too; the switch stands either way, so report, not raise
            await self.preflight(record, run_evals=False, actor=actor)
        except PreflightFailed as problem:
            log.warning("after rolling back %s to %s: %s", model, target, problem.message)
            return {**result, "post_check": problem.message}
        return {**result, "post_check": "ok"}

    async def _give_back_unless_switched(self, model: str, target: str, loaded: list[LoadedAdapter]) -> str:
        """After a rollback failed past its loads: the adapters loaded would serve under a release
        that is not active, so give them back, unless the switch landed before the failure (then
        they are what the active release needs). When the store cannot say, touch nothing."""
        try:
            active, _ = await self._store.release_active(model)
        except StoreUnavailable as error:
            why = f"the store cannot say whether the switch landed ({error})"
            log.error("rollback of %s to %s failed after loading adapters; %s: they stay", model, target, why)
            return "the adapters loaded stay: the store cannot say whether the switch landed"
        if active == target:
            return "the switch landed; the adapters loaded stay"
        said = f"nothing switched: {await give_back(loaded)}"
        log.warning("rollback of %s to %s failed after loading adapters; %s", model, target, said)
        return said

    async def rollback_target(self, model: str) -> str | None:
        active, _ = await self._store.release_active(model)
        return rollback_target(await self._store.release_history(model, HISTORY_CAP), active)

    async def _previous(self, model: str) -> str:
        target = await self.rollback_target(model)
        if target is None:
            raise InvalidRequest(
                f"{model} has no earlier release to roll back to; name the release (--to on the CLI,"
                ' "version" over HTTP)'
            )
        return target


def _smoke_pin(spec: ReleaseSpec) -> SmokePin | None:
    if spec.smoke_samples is None:
        return None
    if not Path(spec.smoke_samples).is_file():
        raise InvalidRequest(f"smoke samples {spec.smoke_samples} not found", param="smoke_samples")
    return SmokePin(
        samples=str(Path(spec.smoke_samples).resolve()),
        count=spec.smoke_count,
        slo_ttft_ms=spec.smoke_slo_ttft_ms,
        slo_tpot_ms=spec.smoke_slo_tpot_ms,
        min_goodput=spec.smoke_min_goodput,
    )


def _eval_pin(path: str | None) -> EvalSetPin | None:
    if path is None:
        return None
    from eval.sets import EvalSetError, load_eval_set

    try:
        eval_set = load_eval_set(Path(path))
    except EvalSetError as error:
        raise InvalidRequest("; ".join(error.problems), param="eval_set") from None
    # The content is pinned, not only the path: the gateway that promotes may run elsewhere, and a
    # file can change. The path stays for people reading the record.
    return EvalSetPin(
        id=eval_set.id,
        version=eval_set.version,
        digest=eval_set.digest,
        path=str(Path(path).resolve()),
        content=eval_set.canonical_json().decode(),
    )
