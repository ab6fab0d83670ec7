"""`gateway releases create | list | promote | rollback MODEL`, on the store named by --config.

A switch made here reaches every running replica within `releases.watch_interval_s`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from gateway.cli.context import CliContext, config_option, run
from gateway.releases.checkpoints import CheckpointRegistry
from gateway.releases.service import ActiveReleases, ReleaseService, ReleaseSpec
from gateway.routing.health import HealthMonitor

T = TypeVar("T")


def _with_service(work: Callable[[ReleaseService, CliContext], Awaitable[T]]) -> Callable[[CliContext], Awaitable[T]]:
    async def wrapped(ctx: CliContext) -> T:
        from gateway.app import build_router  # the deployments, to check their health

        router = build_router(ctx.settings)
        deployments = [d for group in router.groups.values() for d in group.deployments]
        registry_root = ctx.settings.releases.checkpoint_registry
        registry = CheckpointRegistry(registry_root) if registry_root else None
        health = HealthMonitor(deployments, ctx.settings.routing.health)
        service = ReleaseService(ctx.store, ctx.audit, router, health, registry, ActiveReleases())
        try:
            return await work(service, ctx)
        finally:
            for deployment in deployments:
                await deployment.backend.aclose()

    return wrapped


def _print(payload: Any) -> None:
    click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode())


@click.group("releases")
def releases_group() -> None:
    """Model releases: create, promote with a preflight, roll back in one command."""


@releases_group.command("create")
@config_option
@click.argument("model")
@click.option("--version", "version", required=True)
@click.option("--deployments", default="", help="comma-separated; empty: every deployment of the model")
@click.option("--checkpoint", default=None, help="a version in the checkpoint registry, e.g. run@1200")
@click.option("--system-prompt", default="")
@click.option("--prompt-version", default="")
@click.option("--eval-set", default=None, type=click.Path(dir_okay=False))
@click.option("--min-pass-rate", type=click.FloatRange(0, 1), default=1.0)
@click.option("--smoke-samples", default=None, type=click.Path(dir_okay=False), help="replay smoke run samples")
@click.option("--smoke-count", type=click.IntRange(1, 1000), default=10)
@click.option("--smoke-slo-ttft-ms", type=float, default=None)
@click.option("--smoke-slo-tpot-ms", type=float, default=None)
@click.option("--smoke-min-goodput", type=click.FloatRange(0, 1), default=1.0)
@click.option("--notes", default="")
def create_command(config_path: Path, model: str, **fields: Any) -> None:
    """Record an immutable release."""
    fields["deployments"] = [d for d in fields["deployments"].split(",") if d]
    spec = ReleaseSpec(**fields)
    _print(run(config_path, _with_service(lambda s, ctx: s.create(ctx.operator, model, spec))))


@releases_group.command("list")
@config_option
@click.argument("model")
def list_command(config_path: Path, model: str) -> None:
    """Releases, the active one and the switch history."""
    _print(run(config_path, _with_service(lambda s, ctx: s.overview(model))))


@releases_group.command("promote")
@config_option
@click.argument("model")
@click.argument("version")
@click.option("--reason", default="")
def promote_command(config_path: Path, model: str, version: str, reason: str) -> None:
    """Preflight (checkpoint, health, evals), then make VERSION active."""
    _print(run(config_path, _with_service(lambda s, ctx: s.promote(ctx.operator, model, version, reason))))


@releases_group.command("rollback")
@config_option
@click.argument("model")
@click.option("--to", "to_version", default=None, help="default: the release before the active one")
@click.option("--reason", default="")
def rollback_command(config_path: Path, model: str, to_version: str | None, reason: str) -> None:
    """Switch back, verified before and after the switch."""
    _print(run(config_path, _with_service(lambda s, ctx: s.rollback(ctx.operator, model, to_version, reason))))
