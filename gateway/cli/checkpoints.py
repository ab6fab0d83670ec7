"""`gateway checkpoints register | verify | list | latest-valid`, on a registry under --root."""

from __future__ import annotations

from pathlib import Path

import click

from gateway.releases.checkpoints import DEFAULT_ROOT, CheckpointRegistry, RegistryEntry, RegistryError
from gateway.releases.manifest import UnknownFormatError

root_option = click.option(
    "--root",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_ROOT,
    show_default=True,
    help="directory holding the checkpoint registry",
)


@click.group("checkpoints")
def checkpoints_group() -> None:
    """Register and verify versioned training checkpoints."""


@checkpoints_group.command("register")
@click.argument("path", type=click.Path(path_type=Path, exists=True))
@click.option("--run", required=True, help="training run name")
@click.option("--step", required=True, type=click.IntRange(min=0), help="training step of this checkpoint")
@root_option
def register_command(path: Path, run: str, step: int, root: Path) -> None:
    """Write PATH's manifest (if it has none) and record it as RUN@STEP."""
    try:
        entry = CheckpointRegistry(root).register(path, run, step)
    except (RegistryError, UnknownFormatError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"registered {entry.version} ({entry.format}) {entry.manifest_digest}")


@checkpoints_group.command("verify")
@click.argument("version")
@root_option
def verify_command(version: str, root: Path) -> None:
    """Recompute every file's hash; exit 1 naming each missing, truncated, grown, changed or extra file."""
    try:
        report = CheckpointRegistry(root).verify(version)
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    if report.ok:
        count = len(report.manifest.files) if report.manifest else 0
        click.echo(f"ok {version}: {count} files match the manifest")
        return
    for problem in report.problems:
        click.echo(str(problem))
    click.echo(f"FAILED {version}: {len(report.problems)} problem(s) in {report.path}", err=True)
    raise SystemExit(1)


def _table(entries: list[RegistryEntry]) -> list[str]:
    rows = [("VERSION", "STEP", "FORMAT", "REGISTERED", "PATH")]
    for entry in entries:
        when = entry.registered_at.strftime("%Y-%m-%d %H:%M:%S")
        rows.append((entry.version, str(entry.step), str(entry.format), when, entry.path))
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


@checkpoints_group.command("list")
@click.option("--run", default=None, help="only this run")
@root_option
def list_command(run: str | None, root: Path) -> None:
    """Registered versions, by run then step."""
    entries = CheckpointRegistry(root).list(run)
    if not entries:
        click.echo("no checkpoints registered", err=True)
        return
    for line in _table(entries):
        click.echo(line)


@checkpoints_group.command("latest-valid")
@click.option("--run", default=None, help="only this run")
@root_option
def latest_valid_command(run: str | None, root: Path) -> None:
    """Print the newest version whose files match its manifest; exit 1 if there is none."""
    result = CheckpointRegistry(root).latest_valid(run)
    for entry, report in result.skipped:
        reasons = "; ".join(str(problem) for problem in report.problems)
        click.echo(f"skipping {entry.version}: {reasons}", err=True)
    if result.entry is None:
        click.echo("no valid checkpoint", err=True)
        raise SystemExit(1)
    click.echo(f"{result.entry.version}\t{result.entry.path}")
