"""Model releases: which checkpoint, prompt and eval set each model serves, the canary, the
preflight that runs a candidate through a client's path before a switch, and the watchers that
follow other replicas' switches and re-verify the served checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from checkpoints.registry import CheckpointRegistry
from gateway.assembly.access import Access
from gateway.assembly.foundation import Foundation
from gateway.assembly.lifecycle import Part, background
from gateway.core.principal import Principal
from gateway.http.candidate_app import CandidateApp
from gateway.http.releases_api import build_releases_router
from gateway.pipeline import Handler
from gateway.releases.active import ActiveReleases
from gateway.releases.service import ReleaseService
from gateway.releases.stage import ApplyRelease, CanaryFallback
from gateway.releases.watchers import CheckpointWatch, ReleaseWatcher
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class Releases:
    checkpoint_problems: dict[str, list[str]]  # per model, for readiness
    apply_release: ApplyRelease
    canary_fallback: CanaryFallback
    part: Part


def build_releases(
    settings: Settings, base: Foundation, access: Access, candidate_path: Callable[[Principal], Handler]
) -> Releases:
    """`candidate_path(actor)`: a client's request path pinned to the candidate, run as `actor`
    (the preflight's eval cases and smoke run); called per preflight, so it may close over
    stages built after this."""
    config = settings.releases
    active = ActiveReleases()
    registry = CheckpointRegistry(config.checkpoint_registry) if config.checkpoint_registry else None
    candidate = CandidateApp(candidate_path, access.authenticator, access.tenancy, settings.server)
    telemetry = base.telemetry
    service = ReleaseService(
        base.store,
        base.audit,
        base.router,
        base.health,
        registry,
        active,
        candidate,
        on_canary_abort=telemetry.record_canary_abort,
    )
    watcher = ReleaseWatcher(base.store, service, config.watch_interval_s, on_corrupt=telemetry.record_release_corrupt)
    checkpoint_watch = CheckpointWatch(active, config.verify_interval_s)
    router = build_releases_router(access.authenticator, service, access.tenancy, config.file_roots)
    return Releases(
        checkpoint_problems=active.checkpoint_problems,
        apply_release=ApplyRelease(active, service),
        canary_fallback=CanaryFallback(),
        part=Part(
            routers=(router,),
            running=(background(watcher.run, "release-watch"), background(checkpoint_watch.run, "checkpoint-verify")),
        ),
    )
