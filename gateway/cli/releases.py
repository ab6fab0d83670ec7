"""`gateway releases create | list | promote | rollback MODEL`, on the store named by --config.

A switch made here reaches every running replica within `releases.watch_interval_s`. With
`--gateway URL` (and GATEWAY_ADMIN_KEY) promote and rollback ask a running gateway instead: its eval
gate runs through the gateway's request path, and load hooks start servers on the gateway's
machine, never on the operator's; without it, such a preflight is refused rather than run here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
import orjson

from checkpoints.registry import CheckpointRegistry
from gateway.cli.context import CliContext, config_option, run
from gateway.releases.active import ActiveReleases
from gateway.releases.service import ReleaseService, ReleaseSpec
from gateway.routing.health import HealthMonitor

T = TypeVar("T")


def _with_service(work: Callable[[ReleaseService, CliContext], Awaitable[T]]) -> Callable[[CliContext], Awaitable[T]]:
    async def wrapped(ctx: CliContext) -> T:
        from gateway.assembly.foundation import build_router  # the deployments, to check their health

        router = build_router(ctx.settings)
        deployments = [d for group in router.groups.values() for d in group.deployments]
        registry_root = ctx.settings.releases.checkpoint_registry
        registry = CheckpointRegistry(registry_root) if registry_root else None
        health = HealthMonitor(deployments, ctx.settings.routing.health)
        service = ReleaseService(ctx.store, ctx.audit, router, health, registry, ActiveReleases(), run_load_hooks=False)
        try:
            return await work(service, ctx)
        finally:
            for deployment in deployments:
                await deployment.backend.aclose()

    return wrapped


def _print(payload: Any) -> None:
    click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode())


gateway_option = click.option(
    "--gateway",
    "gateway_url",
    default=None,
    envvar="GATEWAY_URL",
    help="ask this running gateway (admin key from GATEWAY_ADMIN_KEY) instead of switching from here",
)
_GATEWAY_TIMEOUT = httpx.Timeout(900.0, connect=10.0)  # a rollback may wait for a load hook's server


def _ask_gateway(url: str, model: str, action: str, body: dict[str, Any] | None, method: str = "POST") -> Any:
    key = os.environ.get("GATEWAY_ADMIN_KEY", "")
    if not key:
        raise click.ClickException("--gateway needs the admin key in GATEWAY_ADMIN_KEY")
    try:
        reply = httpx.request(
            method,
            f"{url.rstrip('/')}/admin/models/{model}/{action}",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=_GATEWAY_TIMEOUT,
        )
    except httpx.HTTPError as error:
        raise click.ClickException(f"could not reach the gateway at {url}: {error!r}") from None
    try:
        payload = reply.json()
    except ValueError:
        payload = {"error": {"message": reply.text[:500]}}
    if reply.status_code >= 400:
        raise click.ClickException(f"{reply.status_code}: {payload.get('error', {}).get('message', payload)}")
    return payload


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
@click.option("--min-pass-rate", type=click.FloatRange(0, 1), default=None, help="default: the eval set's threshold")
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
    created = run(config_path, _with_service(lambda s, ctx: s.create(ctx.operator, model, spec)))
    _print(created.to_dict())


@releases_group.command("list")
@config_option
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="the whole overview as JSON, for machines")
def list_command(config_path: Path, model: str, as_json: bool) -> None:
    """Releases, the active one, the canary and the rollback target."""
    overview = run(config_path, _with_service(lambda s, ctx: s.overview(model)))
    if as_json:
        _print(overview)
        return
    for line in _table(overview):
        click.echo(line)


def _table(overview: dict[str, Any]) -> list[str]:
    canary = overview["canary"]
    rows = [("", "VERSION", "CHECKPOINT", "PROMPT", "EVAL SET", "DEPLOYMENTS", "CREATED")]
    for release in overview["releases"]:
        version = release["version"]
        mark = "*" if version == overview["active"] else ("~" if canary and canary["version"] == version else "")
        eval_set = release.get("eval_set") or {}
        rows.append(
            (
                mark,
                version,
                (release.get("checkpoint") or {}).get("version", "-"),
                release["prompt"].get("version") or "-",
                f"{eval_set['id']}@{eval_set['version']}" if eval_set else "-",
                ",".join(release["deployments"]),
                time.strftime("%Y-%m-%d %H:%M", time.gmtime(release["created_at"])),
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.append("")
    lines.append(f"active: {overview['active'] or 'none'} (generation {overview['generation']}, * above)")
    if canary:
        lines.append(f"canary: {canary['version']} at {float(canary['share']):.0%} of new requests (~ above)")
    lines.append(f"a plain rollback goes to: {overview['rollback_target'] or 'nothing (name a release with --to)'}")
    return lines


@releases_group.command("promote")
@config_option
@gateway_option
@click.argument("model")
@click.argument("version")
@click.option("--reason", default="")
def promote_command(config_path: Path, gateway_url: str | None, model: str, version: str, reason: str) -> None:
    """Preflight (checkpoint, health, evals through the gateway), then make VERSION active."""
    if gateway_url:
        _print(_ask_gateway(gateway_url, model, "promote", {"version": version, "reason": reason}))
        return
    _print(run(config_path, _with_service(lambda s, ctx: s.promote(ctx.operator, model, version, reason))))


@releases_group.command("rollback")
@config_option
@gateway_option
@click.argument("model")
@click.option("--to", "to_version", default=None, help="default: one step back through the activation history")
@click.option("--reason", default="")
def rollback_command(
    config_path: Path, gateway_url: str | None, model: str, to_version: str | None, reason: str
) -> None:
    """Switch back, verified before and after the switch."""
    if gateway_url:
        _print(_ask_gateway(gateway_url, model, "rollback", {"version": to_version, "reason": reason}))
        return
    _print(run(config_path, _with_service(lambda s, ctx: s.rollback(ctx.operator, model, to_version, reason))))


@releases_group.group("canary")
def canary_group() -> None:
    """Send a share of traffic to a candidate (through a running gateway: --gateway or GATEWAY_URL)."""


gateway_required = click.option(
    "--gateway", "gateway_url", required=True, envvar="GATEWAY_URL", help="the gateway (admin key: GATEWAY_ADMIN_KEY)"
)


@canary_group.command("start")
@gateway_required
@click.argument("model")
@click.argument("version")
@click.option("--share", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.1, show_default=True)
@click.option("--steps", default=None, help="rising shares, e.g. 0.05,0.25,1: up a step per clean window, 1 promotes")
@click.option("--window-s", type=click.FloatRange(0, min_open=True), default=300.0, show_default=True)
@click.option("--max-error-rate", type=click.FloatRange(0, 1), default=0.05, show_default=True)
@click.option("--max-latency-ratio", type=click.FloatRange(1, min_open=True), default=1.5, show_default=True)
@click.option("--min-requests", type=click.IntRange(1), default=20, show_default=True)
def canary_start_command(gateway_url: str, model: str, version: str, steps: str | None, **settings: Any) -> None:
    """Preflight VERSION, then send it a share of new requests; rolled back on a breach."""
    body: dict[str, Any] = {"version": version, **settings}
    if steps:
        try:
            body["steps"] = [float(share) for share in steps.split(",")]
        except ValueError:
            raise click.BadParameter("comma-separated numbers, e.g. 0.05,0.25,1", param_hint="--steps") from None
    _print(_ask_gateway(gateway_url, model, "canary", body))


@canary_group.command("status")
@gateway_required
@click.argument("model")
def canary_status_command(gateway_url: str, model: str) -> None:
    """The running canary and the gateway's live figures for it."""
    status = _ask_gateway(gateway_url, model, "canary", None, method="GET")
    canary = status["canary"]
    if canary is None:
        click.echo(f"{model}: no canary running")
        return
    step = f", step {int(canary['step']) + 1} of {len(canary['steps'])}" if canary.get("steps") else ""
    click.echo(
        f"{model}: canary {canary['version']} at {float(canary['share']):.0%}{step} (baseline {canary['baseline']})"
    )
    for side in ("candidate", "baseline"):
        figures = status["stats"][side]
        rate = "-" if figures["error_rate"] is None else f"{figures['error_rate']:.1%}"
        ttft = "-" if figures["ttft_p50_s"] is None else f"{figures['ttft_p50_s'] * 1000:.0f} ms"
        click.echo(f"  {side:9} {figures['requests']:6d} requests  errors {rate:>6}  TTFT p50 {ttft}")
    click.echo(f"  (last {status['stats']['window_s']:g}s, as seen by the replica that answered)")


@canary_group.command("stop")
@gateway_required
@click.argument("model")
def canary_stop_command(gateway_url: str, model: str) -> None:
    """End the canary: every new request goes to the active release."""
    _print(_ask_gateway(gateway_url, model, "canary", None, method="DELETE"))
