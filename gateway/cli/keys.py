"""`gateway keys create | list | show | revoke | rotate`, on the store named by --config."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from gateway.cli.context import CliContext, config_option, run
from gateway.core.principal import Limits
from gateway.settings import MAX_LIMIT
from gateway.store.base import KeyRecord

if TYPE_CHECKING:
    from gateway.auth.api_keys import KeyService

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_expiry(value: str | None, now: float) -> float | None:
    """`30d`, `12h`, `15m`, `90s`, or an ISO date/time."""
    if not value:
        return None
    match = _DURATION.match(value.strip())
    if match:
        return now + int(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected e.g. 30d, 12h or 2027-01-31", param_hint="--expires") from None


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _service(ctx: CliContext) -> KeyService:
    from gateway.auth.api_keys import KeyService  # the service's imports only when a command runs
    from gateway.auth.tenancy import ModelTenancy

    # The config's models and their tenants: a key naming a model its tenant cannot use is refused.
    return KeyService(ctx.store, ctx.audit, ModelTenancy({m.name: m.tenants for m in ctx.settings.models}))


def _print_json(payload: Any) -> None:
    click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode())


@click.group("keys")
def keys_group() -> None:
    """Manage API keys (secrets are shown once, stored only as SHA-256)."""


@keys_group.command("create")
@config_option
@click.option("--name", required=True)
@click.option("--tenant", required=True)
@click.option("--models", default="", help="comma-separated; empty: every model")
@click.option("--scopes", default="chat", show_default=True, help="comma-separated: chat,admin,approver,audit,platform")
@click.option("--rpm", type=click.IntRange(min=1, max=MAX_LIMIT), default=None)
@click.option("--tpm", type=click.IntRange(min=1, max=MAX_LIMIT), default=None)
@click.option("--max-concurrency", type=click.IntRange(min=1, max=MAX_LIMIT), default=None)
@click.option("--daily-tokens", type=click.IntRange(min=1, max=MAX_LIMIT), default=None)
@click.option("--expires", default=None, help="30d, 12h, or an ISO date")
def create_command(
    config_path: Path,
    name: str,
    tenant: str,
    models: str,
    scopes: str,
    rpm: int | None,
    tpm: int | None,
    max_concurrency: int | None,
    daily_tokens: int | None,
    expires: str | None,
) -> None:
    """Create a key and print its secret (the only time it is shown)."""
    from gateway.auth.api_keys import NewKey

    new = NewKey(
        name=name,
        tenant=tenant,
        scopes=_csv(scopes),
        models=_csv(models),
        limits=Limits(rpm, tpm, max_concurrency, daily_tokens),
        expires_at=parse_expiry(expires, time.time()),
    )
    issued = run(config_path, lambda ctx: _service(ctx).create(ctx.operator, new))
    click.echo(f"id:     {issued.record.id}")
    click.echo(f"secret: {issued.secret}")
    click.echo("Store the secret now: only its SHA-256 is kept.", err=True)


def _row(record: KeyRecord) -> str:
    state = (
        "revoked"
        if record.revoked_at
        else "expired"
        if record.expires_at and record.expires_at < time.time()
        else "active"
    )
    scopes = ",".join(record.scopes)
    return f"{record.id:<22} {record.prefix:<14} {record.tenant:<16} {record.name:<20} {scopes:<24} {state}"


@keys_group.command("generate")
def generate_command() -> None:
    """Print a fresh random key (e.g. for GATEWAY_ADMIN_KEY); nothing is stored."""
    from gateway.auth.stage import new_secret

    click.echo(new_secret())


@keys_group.command("list")
@config_option
def list_command(config_path: Path) -> None:
    """List keys of every tenant."""
    records = run(config_path, lambda ctx: _service(ctx).list(ctx.operator))
    click.echo(f"{'ID':<22} {'PREFIX':<14} {'TENANT':<16} {'NAME':<20} {'SCOPES':<24} STATE")
    for record in records:
        click.echo(_row(record))


@keys_group.command("show")
@config_option
@click.argument("key_id")
def show_command(config_path: Path, key_id: str) -> None:
    """Show one key (never its secret)."""
    from gateway.auth.api_keys import public_view

    _print_json(public_view(run(config_path, lambda ctx: _service(ctx).get(ctx.operator, key_id))))


@keys_group.command("revoke")
@config_option
@click.argument("key_id")
@click.option("--reason", default="", help="recorded in the audit log")
def revoke_command(config_path: Path, key_id: str, reason: str) -> None:
    """Revoke a key; every replica refuses it within auth.cache_ttl_s."""
    record = run(config_path, lambda ctx: _service(ctx).revoke(ctx.operator, key_id, reason))
    click.echo(f"revoked {record.id}")


@keys_group.command("rotate")
@config_option
@click.argument("key_id")
def rotate_command(config_path: Path, key_id: str) -> None:
    """Give a key a new secret; the old one stops working."""
    issued = run(config_path, lambda ctx: _service(ctx).rotate(ctx.operator, key_id))
    click.echo(f"id:     {issued.record.id}")
    click.echo(f"secret: {issued.secret}")
