"""Model releases: immutable records that pin a checkpoint, deployments, a prompt and an eval set,
and the one active release per logical model.

Promotion runs a preflight (checkpoint manifest verifies, deployments healthy, eval set passes)
before switching. Rollback switches back to the previous release (or a named one) after checking
the target the same way, then probes it once more. A switch is a compare-and-set on the model's
generation in the store: concurrent switches are serialized (one wins; a loser whose target is
already active succeeds idempotently), and every replica notices the new generation within its
poll interval (`ReleaseWatcher`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.audit import AuditWriter
from gateway.errors import Conflict, GatewayError, InvalidRequest, NotFound
from gateway.principal import Principal, Scope
from gateway.releases.canary import CanaryMonitor, Outcome
from gateway.releases.checkpoints import CheckpointRegistry, RegistryError
from gateway.releases.load_hooks import bring_up as bring_up_deployment
from gateway.releases.served import mismatches, served_roots
from gateway.releases.smoke import run_smoke
from gateway.routing.health import HealthMonitor
from gateway.routing.router import Router
from gateway.store.base import Store

log = logging.getLogger(__name__)


class PreflightFailed(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "preflight_failed"


@dataclass(frozen=True, slots=True)
class ReleaseSpec:
    version: str
    deployments: Sequence[str] = ()  # empty: every deployment of the model
    checkpoint: str | None = None  # a version in the checkpoint registry, e.g. "llama-ft@1200"
    system_prompt: str = ""
    prompt_version: str = ""
    eval_set: str | None = None  # path of an eval set (eval/ package format)
    min_pass_rate: float = 1.0
    smoke_samples: str | None = None  # request samples for a replay smoke run (replay/ formats)
    smoke_count: int = 10
    smoke_slo_ttft_ms: float | None = None
    smoke_slo_tpot_ms: float | None = None
    smoke_min_goodput: float = 1.0
    notes: str = ""


@dataclass
class ActiveReleases:
    """This replica's view of each model's active release (kept fresh by ReleaseWatcher)."""

    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    canaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # the canary settings
    canary_records: dict[str, dict[str, Any]] = field(default_factory=dict)  # the candidate release


class ReleaseService:
    def __init__(
        self,
        store: Store,
        audit: AuditWriter,
        router: Router,
        health: HealthMonitor,
        checkpoints: CheckpointRegistry | None,
        active: ActiveReleases,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._audit = audit
        self._router = router
        self._health = health
        self._checkpoints = checkpoints
        self.active = active
        self._clock = clock
        self.hook_processes: list[asyncio.subprocess.Process] = []  # started by command load hooks
        self.canary_monitor = CanaryMonitor()
        self._aborting: set[str] = set()

    def observe(self, model: str, outcome: Outcome) -> None:
        """One finished request; ends the canary (once) when its candidate breaches a threshold."""
        self.canary_monitor.observe(model, outcome)
        canary = self.active.canaries.get(model)
        if canary is None or model in self._aborting:
            return
        breach = self.canary_monitor.breach(model, canary)
        if breach:
            self._aborting.add(model)
            task = asyncio.get_running_loop().create_task(self._abort(model, breach))
            task.add_done_callback(lambda _: self._aborting.discard(model))

    async def _abort(self, model: str, breach: str) -> None:
        try:
            await self.end_canary("canary-monitor", model, f"automatic rollback: {breach}")
        except GatewayError as error:  # store down or racing switch: the next request tries again
            log.warning("could not end the canary of %s: %s", model, error.message)

    # --- records ------------------------------------------------------------------------------
    async def create(self, actor: Principal, model: str, spec: ReleaseSpec) -> dict[str, Any]:
        actor.require(Scope.ADMIN)
        group = self._group(model)
        known = {d.name for d in group.deployments}
        unknown = sorted(set(spec.deployments) - known)
        if unknown:
            raise InvalidRequest(f"model '{model}' has no deployments named {', '.join(unknown)}", param="deployments")
        record: dict[str, Any] = {
            "model": model,
            "version": spec.version,
            "deployments": list(spec.deployments) or sorted(known),
            "checkpoint": self._checkpoint_pin(spec.checkpoint),
            "prompt": {
                "version": spec.prompt_version,
                "system_prompt": spec.system_prompt,
                "sha256": hashlib.sha256(spec.system_prompt.encode()).hexdigest(),
            },
            "eval_set": _eval_pin(spec.eval_set),
            "thresholds": {"min_pass_rate": spec.min_pass_rate},
            "smoke": _smoke_pin(spec),
            "notes": spec.notes,
            "author": actor.key_id,
            "created_at": self._clock(),
        }
        if not await self._store.release_put(record):
            raise Conflict(f"release {model}@{spec.version} exists; releases are immutable")
        await self._record(actor, "release.create", model, None, spec.version, "")
        return record

    def _checkpoint_pin(self, version: str | None) -> dict[str, Any] | None:
        if version is None:
            return None
        if self._checkpoints is None:
            raise InvalidRequest("releases.checkpoint_registry is not configured", param="checkpoint")
        try:
            entry = self._checkpoints.get(version)
        except RegistryError as error:
            raise InvalidRequest(str(error), param="checkpoint") from None
        return {"version": version, "path": entry.path, "manifest_digest": entry.manifest_digest}

    async def overview(self, model: str) -> dict[str, Any]:
        self._group(model)
        active, generation = await self._store.release_active(model)
        return {
            "model": model,
            "active": active,
            "generation": generation,
            "canary": await self._store.release_canary(model),
            "releases": await self._store.release_list(model),
            "history": await self._store.release_history(model, 50),
        }

    # --- switching ----------------------------------------------------------------------------
    async def promote(self, actor: Principal, model: str, version: str, reason: str = "") -> dict[str, Any]:
        actor.require(Scope.ADMIN)
        record = await self._release(model, version)
        serving = await self.preflight(record, run_evals=True)
        return await self._switch(actor, model, version, "release.promote", reason, serving)

    async def rollback(
        self, actor: Principal, model: str, to_version: str | None = None, reason: str = ""
    ) -> dict[str, Any]:
        actor.require(Scope.ADMIN)
        target = to_version or await self._previous(model)
        record = await self._release(model, target)
        # The old release passed its evals already; its deployments may need bringing back.
        serving = await self.preflight(record, run_evals=False, bring_up=True)
        result = await self._switch(actor, model, target, "release.rollback", reason, serving)
        try:  # verified after the switch too; the switch stands either way, so report, not raise
            await self.preflight(record, run_evals=False)
        except PreflightFailed as problem:
            log.warning("after rolling back %s to %s: %s", model, target, problem.message)
            return {**result, "post_check": problem.message}
        return {**result, "post_check": "ok"}

    async def preflight(
        self, record: dict[str, Any], *, run_evals: bool, bring_up: bool = False
    ) -> dict[str, str | None]:
        """Raise PreflightFailed naming every problem with this release; else return what each of
        its deployments reports it serves (None: the server does not say)."""
        problems = await self._checkpoint_problems(record) + await self._health_problems(record, bring_up)
        serving: dict[str, str | None] = {}
        if not problems:
            serving, mismatched = await self._served(record)
            problems += mismatched
        if run_evals and not problems:
            problems += await self._eval_problems(record)
        if not problems:
            problems += await self._smoke_problems(record)
        if problems:
            raise PreflightFailed(f"{record['model']}@{record['version']}: " + "; ".join(problems))
        return serving

    async def _served(self, record: dict[str, Any]) -> tuple[dict[str, str | None], list[str]]:
        """What the release's deployments serve, and the ones that do not serve its checkpoint."""
        group = self._group(record["model"])
        chosen = [d.settings for d in group.deployments if d.name in record["deployments"]]
        serving = await served_roots(chosen)
        pin = record.get("checkpoint")
        return serving, (mismatches(pin["path"], serving) if pin else [])

    async def _checkpoint_problems(self, record: dict[str, Any]) -> list[str]:
        pin = record.get("checkpoint")
        if pin is None:
            return []
        from gateway.releases.checkpoints import verify

        # Hashing a checkpoint takes seconds per GiB: in a thread (hashlib lets go of the GIL),
        # so that a promote or rollback does not pause traffic.
        report = await asyncio.to_thread(verify, Path(pin["path"]), expected_digest=pin["manifest_digest"])
        return [f"checkpoint {pin['version']} {problem}" for problem in report.problems]

    async def _health_problems(self, record: dict[str, Any], bring_up: bool) -> list[str]:
        group = self._group(record["model"])
        chosen = [d for d in group.deployments if d.name in record["deployments"]]
        results = await asyncio.gather(*(self._health.probe(d) for d in chosen))
        problems = []
        for deployment, ok in zip(chosen, results, strict=True):
            hook = deployment.settings.load_hook
            if ok:
                continue
            if not (bring_up and hook):
                problems.append(f"deployment {deployment.name} is not healthy")
                continue
            checkpoint = (record.get("checkpoint") or {}).get("path")
            problem = await bring_up_deployment(
                deployment.settings,
                hook,
                checkpoint,
                functools.partial(self._health.probe, deployment),
                self.hook_processes,
            )
            if problem:
                problems.append(problem)
        return problems

    async def _eval_problems(self, record: dict[str, Any]) -> list[str]:
        pin = record.get("eval_set")
        if pin is None:
            return []
        from eval.gate import Thresholds, check_gate
        from eval.runner import run_eval
        from eval.sets import load_eval_set

        eval_set = load_eval_set(Path(pin["path"]))
        if eval_set.digest != pin["digest"]:
            return [f"eval set {pin['id']} changed since the release pinned it"]
        group = self._group(record["model"])
        target = next(d for d in group.deployments if d.name in record["deployments"])
        settings = target.settings
        result = await run_eval(eval_set, settings.api_base, settings.api_key, settings.model)
        verdict = check_gate(result, Thresholds(min_pass_rate=record["thresholds"]["min_pass_rate"]))
        return [] if verdict.passed else [f"eval set {pin['id']}: " + "; ".join(verdict.reasons)]

    async def _smoke_problems(self, record: dict[str, Any]) -> list[str]:
        smoke = record.get("smoke")
        if not smoke:
            return []
        group = self._group(record["model"])
        target = next(d for d in group.deployments if d.name in record["deployments"]).settings
        problem = await run_smoke(smoke, target.api_base, target.api_key, target.model)
        return [f"replay smoke run: {problem}"] if problem else []

    async def _switch(
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
            entry = {
                "action": action,
                "from": current,
                "to": version,
                "by": actor.key_id,
                "reason": reason,
                "at": self._clock(),
            }
            won, new_generation = await self._store.release_activate(model, version, generation, entry)
            if won:
                await self.refresh(model)
                await self._record(actor, action, model, current, version, reason, serving)
                return {"model": model, "active": version, "generation": new_generation, "changed": True,
                        "serving": serving}  # fmt: skip
        raise Conflict(f"{model}: the active release keeps changing; try again")

    async def _previous(self, model: str) -> str:
        active, _ = await self._store.release_active(model)
        for entry in await self._store.release_history(model, 100):
            if entry.get("to") == active and entry.get("from"):
                return str(entry["from"])
        raise InvalidRequest(
            f'{model} has no earlier release to roll back to; name the release (--to on the CLI, "version" over HTTP)'
        )

    async def _release(self, model: str, version: str) -> dict[str, Any]:
        self._group(model)
        record = await self._store.release_get(model, version)
        if record is None:
            raise NotFound(f"release {model}@{version} not found")
        return record

    def _group(self, model: str) -> Any:
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
        candidate = await self._store.release_get(model, canary["version"]) if canary else None
        if canary is None or candidate is None:
            self.active.canaries.pop(model, None)
            self.active.canary_records.pop(model, None)
        else:
            self.active.canaries[model], self.active.canary_records[model] = canary, candidate
        self.active.generations[model] = generation

    # --- canaries -----------------------------------------------------------------------------
    async def start_canary(
        self, actor: Principal, model: str, version: str, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """Send `settings["share"]` of new requests to `version` after the same preflight as a promotion."""
        actor.require(Scope.ADMIN)
        record = await self._release(model, version)
        active, generation = await self._store.release_active(model)
        if active is None or active == version:
            raise InvalidRequest(f"a canary needs an active release other than {version}", param="version")
        await self.preflight(record, run_evals=True)
        canary = {**settings, "version": version, "baseline": active, "started_at": self._clock(), "by": actor.key_id}
        won, new_generation = await self._store.release_set_canary(model, canary, generation)
        if not won:
            raise Conflict(f"{model}: the active release changed; try again")
        self.canary_monitor.reset(model)
        await self.refresh(model)
        await self._record(actor, "release.canary.start", model, active, version, str(settings))
        return {"model": model, "canary": canary, "generation": new_generation}

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
                                          "tenant": None, "target": f"{model}@{canary['version']}",
                                          "before": {"canary": canary["version"]}, "after": {"canary": None},
                                          "reason": reason})  # fmt: skip
                return {"model": model, "canary": None, "changed": True, "reason": reason}
        raise Conflict(f"{model}: the release keeps changing; try again")

    async def _record(
        self,
        actor: Principal,
        action: str,
        model: str,
        before: str | None,
        after: str,
        reason: str,
        serving: dict[str, str | None] | None = None,
    ) -> None:
        await self._audit.submit(
            {
                "kind": "admin",
                "action": action,
                "actor": actor.key_id,
                "tenant": None,
                "target": f"{model}@{after}",
                "before": {"active": before},
                "after": {"active": after} if serving is None else {"active": after, "serving": serving},
                "reason": reason,
            }
        )


def _smoke_pin(spec: ReleaseSpec) -> dict[str, Any] | None:
    if spec.smoke_samples is None:
        return None
    if not Path(spec.smoke_samples).is_file():
        raise InvalidRequest(f"smoke samples {spec.smoke_samples} not found", param="smoke_samples")
    return {
        "samples": spec.smoke_samples,
        "count": spec.smoke_count,
        "slo_ttft_ms": spec.smoke_slo_ttft_ms,
        "slo_tpot_ms": spec.smoke_slo_tpot_ms,
        "min_goodput": spec.smoke_min_goodput,
    }


def _eval_pin(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    from eval.sets import EvalSetError, load_eval_set

    try:
        eval_set = load_eval_set(Path(path))
    except EvalSetError as error:
        raise InvalidRequest("; ".join(error.problems), param="eval_set") from None
    return {"id": eval_set.id, "version": eval_set.version, "digest": eval_set.digest, "path": path}
