"""`gateway checkpoints register | verify | list | latest-valid`, on a registry under --root (or the
one a gateway config names with --config, like every other command)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from checkpoints.manifest import UnknownFormatError
from checkpoints.registry import DEFAULT_ROOT, CheckpointRegistry, RegistryEntry, RegistryError


def root_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--root DIR` or `--config FILE` (its releases.checkpoint_registry); passes `root` on."""

    @click.option(
        "--root",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help=f"directory holding the checkpoint registry [default: {DEFAULT_ROOT}]",
    )
    @click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="a gateway config: use its releases.checkpoint_registry",
    )
    @functools.wraps(command)
    def wrapper(*args: Any, root: Path | None, config_path: Path | None, **kwargs: Any) -> Any:
        return command(*args, root=_registry_root(root, config_path), **kwargs)

    return wrapper


def _registry_root(root: Path | None, config_path: Path | None) -> Path:
    if config_path is None:
        return root or DEFAULT_ROOT
    from gateway.cli.serve import load_or_exit

    configured = load_or_exit(config_path).releases.checkpoint_registry
    if configured is None:
        raise click.UsageError(f"{config_path} sets no releases.checkpoint_registry")
    if root is not None and root.resolve() != Path(configured).resolve():
        raise click.UsageError(f"--root {root} is not the registry {config_path} names ({configured})")
    return Path(configured)


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
