"""`gateway approvals list | show | approve | reject`, on the store named by --config."""

from __future__ import annotations

import time
from pathlib import Path

import click
import orjson

from gateway.approvals.service import ApprovalService
from gateway.cli.context import CliContext, config_option, run


def _service(ctx: CliContext) -> ApprovalService:
    secret = ctx.settings.tools.approval_secret
    if not secret:
        raise click.ClickException(
            "tools.approval_secret is not set: tokens issued here would not verify anywhere else"
        )
    return ApprovalService(ctx.store, ctx.audit, secret.encode())


@click.group("approvals")
def approvals_group() -> None:
    """Decide tool calls held for human approval."""


@approvals_group.command("list")
@config_option
@click.option("--status", type=click.Choice(["pending", "approved", "rejected", "expired"]), default="pending")
def list_command(config_path: Path, status: str) -> None:
    """Approvals of every tenant with this status."""
    records = run(config_path, lambda ctx: _service(ctx).list(ctx.operator, status))
    click.echo(f"{'ID':<26} {'TENANT':<14} {'KEY':<22} {'TOOL':<24} {'EXPIRES IN':>10}")
    for record in records:
        left = max(0, int(record["expires_at"] - time.time()))
        click.echo(f"{record['id']:<26} {record['tenant']:<14} {record['key_id']:<22} {record['tool']:<24} {left:>9}s")


@approvals_group.command("show")
@config_option
@click.argument("approval_id")
def show_command(config_path: Path, approval_id: str) -> None:
    """One approval, with the exact arguments it binds."""
    record = run(config_path, lambda ctx: _service(ctx).get(ctx.operator, approval_id))
    click.echo(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode())


@approvals_group.command("approve")
@config_option
@click.argument("approval_id")
@click.option("--reason", default="")
def approve_command(config_path: Path, approval_id: str, reason: str) -> None:
    """Release the call exactly as requested."""
    record = run(config_path, lambda ctx: _service(ctx).decide(ctx.operator, approval_id, approve=True, reason=reason))
    click.echo(f"{record['id']}: {record['status']}")


@approvals_group.command("reject")
@config_option
@click.argument("approval_id")
@click.option("--reason", required=True, help="told to the agent and kept in the audit log")
def reject_command(config_path: Path, approval_id: str, reason: str) -> None:
    """Refuse the call."""
    record = run(config_path, lambda ctx: _service(ctx).decide(ctx.operator, approval_id, approve=False, reason=reason))
    click.echo(f"{record['id']}: {record['status']}")
