"""The preflight of a release: everything that must hold before traffic may switch to it.

The checkpoint's files match its manifest; each deployment is healthy (a rollback may bring one
back with its load hook: on one engine a LoRA load is the traffic switch, so hooks run only after
the checkpoint verified and every other deployment is fine, and a later refusal gives back what
the engines served) and serves the pinned checkpoint (served.py); the eval set passes through
this gateway's own request path pinned to the candidate (candidate.py); a replay smoke run
through the same path, served on a one-time local listener, meets its
SLOs. Every problem is named, not only the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from gateway.core.principal import Principal
from gateway.errors import GatewayError
from gateway.releases.candidate import BASE_URL as CANDIDATE_BASE_URL
from gateway.releases.candidate import ListenerNotStarted
from gateway.releases.load_hooks import LoadedAdapter, give_back
from gateway.releases.load_hooks import bring_up as bring_up_deployment
from gateway.releases.served import Adapter, adapter_to_load, mismatches, served_root, served_roots
from gateway.releases.smoke import run_smoke
from gateway.settings import LoadHookKind

if TYPE_CHECKING:
    import subprocess

    from eval.runner import CaseResult, EvalResult
    from eval.sets import EvalSet
    from gateway.releases.candidate import CandidateTraffic
    from gateway.routing.deployment import Deployment
    from gateway.routing.health import HealthMonitor
    from gateway.routing.router import ModelGroup
    from gateway.store.release_record import Release

log = logging.getLogger(__name__)


Served = dict[str, str | None]  # deployment -> the weights it reports serving (None: it does not say)


class PreflightFailed(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "preflight_failed"


class Preflight:
    """The checks, with what they need: the health monitor that probes a deployment, the model
    groups (`group_of`, NotFound for an unknown model), the candidate's traffic through this
    gateway's own request path (None: the CLI, which has none), and whether load hooks may run
    here (not in the CLI: a hook starts servers, which belong on the gateway's machine)."""

    def __init__(
        self,
        health: HealthMonitor,
        group_of: Callable[[str], ModelGroup],
        candidate: CandidateTraffic | None,
        run_load_hooks: bool,
    ) -> None:
        self._health = health
        self._group = group_of
        self._candidate = candidate
        self._run_load_hooks = run_load_hooks
        self.hook_processes: list[subprocess.Popen[bytes]] = []  # started by command load hooks

    async def __call__(
        self,
        record: Release,
        *,
        run_evals: bool,
        bring_up: bool = False,
        actor: Principal | None = None,
        loaded: list[LoadedAdapter] | None = None,
    ) -> Served:
        """Raise PreflightFailed naming every problem with this release; else return what each of
        its deployments reports it serves (None: the server does not say).

        `bring_up` (a rollback): deployments are brought back only once every check that changes
        nothing has passed. The adapters loaded in place go into `loaded`, for a caller that then
        does not switch to give back; a refusal here gives them back itself and says so."""
        loaded = [] if loaded is None else loaded
        problems = await self._checkpoint_problems(record)
        try:
            # Nothing is loaded into an engine from a checkpoint that does not verify.
            problems += await self._health_problems(record, bring_up and not problems, loaded)
            serving: Served = {}
            if not problems:
                serving, mismatched = await self._served(record)
                problems += mismatched
            if run_evals and not problems:
                problems += await self._eval_problems(record, actor)
            if not problems:
                problems += await self._smoke_problems(record, actor)
        except BaseException:  # the caller gone (cancelled) or a check crashed, after a load
            if loaded:
                stopped = f"{record.model}@{record.version}"
                log.warning("preflight of %s stopped after loading adapters; giving them back", stopped)
                await asyncio.shield(give_back(loaded))
                loaded.clear()
            raise
        if problems and loaded:
            problems.append(f"nothing switched: {await give_back(loaded)}")
            loaded.clear()
        if problems:
            raise PreflightFailed(f"{record.model}@{record.version}: " + "; ".join(problems))
        return serving

    async def _served(self, record: Release) -> tuple[Served, list[str]]:
        """What the release's deployments serve, and the ones that do not serve its checkpoint."""
        group = self._group(record.model)
        chosen = [d.settings for d in group.deployments if d.name in record.deployments]
        serving = await served_roots(chosen)
        pin = record.checkpoint
        return serving, (mismatches(pin.path, serving) if pin else [])

    async def _checkpoint_problems(self, record: Release) -> list[str]:
        pin = record.checkpoint
        if pin is None:
            return []
        from checkpoints.registry import verify

        # Hashing a checkpoint takes seconds per GiB: in a thread (hashlib lets go of the GIL),
        # so that a promote or rollback does not pause traffic.
        report = await asyncio.to_thread(verify, Path(pin.path), expected_digest=pin.manifest_digest)
        return [f"checkpoint {pin.version} {problem}" for problem in report.problems]

    async def _health_problems(self, record: Release, bring_up: bool, loaded: list[LoadedAdapter]) -> list[str]:
        """Deployments that are not healthy (or, with `bring_up`, do not serve the release's
        adapter); those with a load hook are brought back only if no other problem is left."""
        group = self._group(record.model)
        chosen = [d for d in group.deployments if d.name in record.deployments]
        results = await asyncio.gather(*(self._health.probe(d) for d in chosen))
        pinned = record.checkpoint.path if record.checkpoint else None
        problems: list[str] = []
        to_bring_up = []
        for deployment, ok in zip(chosen, results, strict=True):
            adapter = await adapter_to_load(deployment.settings, pinned) if bring_up and ok else Adapter.SERVED
            if adapter is Adapter.UNKNOWN:
                problems.append(f"deployment {deployment.name} did not list its models: its adapter is unknown")
            elif not ok or adapter is Adapter.TO_LOAD:
                problem = self._cannot_bring_up(deployment, ok, bring_up)
                if problem:
                    problems.append(problem)
                else:
                    to_bring_up.append(deployment)
        if problems:
            return problems  # a load hook changes what serves traffic: not for a refused rollback
        return await self._bring_up(to_bring_up, pinned, loaded)

    def _cannot_bring_up(self, deployment: Deployment, ok: bool, bring_up: bool) -> str | None:
        if not (bring_up and deployment.settings.load_hook):
            return f"deployment {deployment.name} is not healthy"
        if not self._run_load_hooks:
            state = "is not healthy" if not ok else "does not serve the release's adapter"
            return (
                f"deployment {deployment.name} {state} and its load hook runs only in the gateway:"
                " roll back through the gateway (gateway releases rollback --gateway URL, or the admin API)"
            )
        return None

    async def _bring_up(
        self, deployments: Sequence[Deployment], pinned: str | None, loaded: list[LoadedAdapter]
    ) -> list[str]:
        for deployment in deployments:
            settings, hook = deployment.settings, deployment.settings.load_hook
            if hook is None:
                continue
            if hook.kind is LoadHookKind.LORA:  # what the name holds now, to give back on a refusal
                loaded.append(LoadedAdapter(settings, hook, await served_root(settings)))
            probe = functools.partial(self._health.probe, deployment)
            problem = await bring_up_deployment(settings, hook, pinned, probe, self.hook_processes)
            if problem:
                return [problem]  # the rollback is refused: bring up no more
        return []

    async def _eval_problems(self, record: Release, actor: Principal | None) -> list[str]:
        pin = record.eval_set
        if pin is None:
            return []
        from eval.gate import Thresholds, check_gate
        from eval.runner import run_eval
        from eval.sets import EvalSetError, load_eval_set, parse_eval_set

        try:  # releases made before sets were pinned by content name a path
            eval_set = (
                parse_eval_set(orjson.loads(pin.content)) if pin.content is not None else load_eval_set(Path(pin.path))
            )
        except (EvalSetError, OSError) as error:
            return [f"eval set {pin.id} cannot be read: {error}"]
        if eval_set.digest != pin.digest:
            return [f"eval set {pin.id} changed since the release pinned it"]
        if self._candidate is not None and actor is not None:
            transport = self._candidate.transport(actor, record.version)
            result = await run_eval(eval_set, CANDIDATE_BASE_URL, None, record.model, transport=transport)
        else:
            # The CLI without --gateway has no request path of a running gateway: the cases go to
            # the release's first deployment with its prompt in front (no tool policy applies).
            result = await self._direct_eval(record, eval_set)
        verdict = check_gate(result, Thresholds(min_pass_rate=record.thresholds.min_pass_rate))
        if verdict.passed:
            return []
        return [f"eval set {pin.id}: " + "; ".join(verdict.reasons) + _failed_cases(result.cases)]

    async def _direct_eval(self, record: Release, eval_set: EvalSet) -> EvalResult:
        from eval.runner import run_eval

        prompt = record.prompt.system_prompt
        if prompt:
            system = {"role": "system", "content": prompt}
            cases = tuple(c.model_copy(update={"messages": (system, *c.messages)}) for c in eval_set.cases)
            eval_set = eval_set.model_copy(update={"cases": cases})
        group = self._group(record.model)
        target = next(d for d in group.deployments if d.name in record.deployments).settings
        return await run_eval(eval_set, str(target.api_base), target.api_key, target.model)

    async def _smoke_problems(self, record: Release, actor: Principal | None) -> list[str]:
        smoke = record.smoke
        if smoke is None:
            return []
        if self._candidate is not None and actor is not None:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    listener = await stack.enter_async_context(self._candidate.listener(actor, record.version))
                except ListenerNotStarted as error:  # a refusal like any other: named and audited
                    return [f"replay smoke run: the local listener did not start: {error}"]
                problem = await run_smoke(smoke, listener.base_url, listener.token, record.model)
        else:
            # As for the eval cases: without a running gateway, the release's first deployment,
            # with the release's prompt in front of each sample (no tool policy applies).
            group = self._group(record.model)
            target = next(d for d in group.deployments if d.name in record.deployments).settings
            prompt = record.prompt.system_prompt
            problem = await run_smoke(smoke, str(target.api_base), target.api_key or "", target.model, prompt)
        return [f"replay smoke run: {problem}"] if problem else []


_CASES_NAMED = 10  # a failed gate names this many failed cases, then counts the rest


def _failed_cases(cases: Sequence[CaseResult]) -> str:
    failed = [c for c in cases if not c.passed]
    named = []
    for case in failed[:_CASES_NAMED]:
        why = case.error or "; ".join(f"{f.kind}: {f.message}" for f in case.failures)
        named.append(f"case {case.case_id} ({why})")
    more = f"; and {len(failed) - _CASES_NAMED} more" if len(failed) > _CASES_NAMED else ""
    return (" - failed: " + "; ".join(named) + more) if named else ""
