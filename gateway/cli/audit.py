"""`gateway audit verify | export | archive`, on the store named by --config."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson

from gateway.audit import Verdict, canonical, iterate, verify_records
from gateway.cli.context import CliContext, config_option, run
from gateway.store.base import AuditHead


def _time(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a Unix time or an ISO date/time") from None


def _read_archive(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _report(verdict: Verdict, where: str) -> None:
    if verdict.ok:
        click.echo(f"{where}: ok, {verdict.checked} records verified")
        return
    click.echo(f"{where}: TAMPERED at record seq {verdict.first_bad_seq}: {verdict.reason}", err=True)
    sys.exit(1)


@click.group("audit")
def audit_group() -> None:
    """Verify, export and archive the hash-chained audit log."""


@audit_group.command("verify")
@config_option
@click.option(
    "--archive",
    "archives",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="archived records (oldest first) to verify in front of the store's records",
)
def verify_command(config_path: Path, archives: tuple[Path, ...]) -> None:
    """Recompute the chain; name the first changed, deleted, inserted or reordered record."""

    async def work(ctx: CliContext) -> tuple[list[dict[str, Any]], AuditHead]:
        anchor = await ctx.store.audit_anchor()
        return [r async for r in iterate(ctx.store, anchor.seq + 1)], anchor

    records, anchor = run(config_path, work)
    start = AuditHead(0, "")
    if archives:
        archived = [r for path in archives for r in _read_archive(path)]
        _report(verify_records(archived, start), "archive")
        if archived:
            start = AuditHead(int(archived[-1]["seq"]), str(archived[-1]["hash"]))
        if start != anchor:
            click.echo(f"archive ends at seq {start.seq} but the store continues from seq {anchor.seq}", err=True)
            sys.exit(1)
    else:
        start = anchor
    _report(verify_records(records, start), "store")
    _report_wipes(records)


def _report_wipes(records: list[dict[str, Any]]) -> None:
    """The chain verifies from where it starts, but a store that was wiped started it again: the
    records before are gone, and verifying what is left must not read as "nothing is missing"."""
    wipes = [r for r in records if r.get("kind") == "store_wiped"]
    for wipe in wipes:
        click.echo(
            f"store: DISCONTINUITY at record seq {wipe.get('seq')}: the store was wiped (epoch "
            f"{wipe.get('previous_epoch')} -> {wipe.get('epoch')}); the records of the earlier chain, "
            f"up to seq {wipe.get('previous_seq')} at least, are not in this store",
            err=True,
        )
    if wipes:
        sys.exit(1)


@audit_group.command("export")
@config_option
@click.option("--since", default=None, help="Unix time or ISO date/time (inclusive)")
@click.option("--until", default=None, help="Unix time or ISO date/time (exclusive)")
@click.option("--format", "fmt", type=click.Choice(["jsonl"]), default="jsonl", show_default=True)
def export_command(config_path: Path, since: str | None, until: str | None, fmt: str) -> None:
    """Write records as JSON lines to stdout, exactly as chained (so they verify)."""
    low, high = _time(since), _time(until)

    async def work(ctx: CliContext) -> int:
        anchor = await ctx.store.audit_anchor()
        count = 0
        async for record in iterate(ctx.store, anchor.seq + 1):
            ts = float(record.get("ts", 0))
            if (low is None or ts >= low) and (high is None or ts < high):
                sys.stdout.buffer.write(canonical(record) + b"\n")
                count += 1
        return count

    count = run(config_path, work)
    click.echo(f"exported {count} records", err=True)


@audit_group.command("archive")
@config_option
@click.option("--before-seq", type=click.IntRange(min=2), required=True, help="archive records with seq below this")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True)
def archive_command(config_path: Path, before_seq: int, out: Path) -> None:
    """Move old records to a JSONL file; the store keeps an anchor so the rest still verifies."""

    async def work(ctx: CliContext) -> int:
        anchor = await ctx.store.audit_anchor()
        moved = [r async for r in iterate(ctx.store, anchor.seq + 1) if int(r["seq"]) < before_seq]
        if not moved:
            return 0
        verdict = verify_records(moved, anchor)
        if not verdict.ok:
            raise click.ClickException(
                f"refusing to archive a broken chain: seq {verdict.first_bad_seq}: {verdict.reason}"
            )
        with out.open("ab") as archive:
            archive.write(b"".join(canonical(r) + b"\n" for r in moved))
        last = moved[-1]
        await ctx.store.audit_trim(before_seq, AuditHead(int(last["seq"]), str(last["hash"])))
        return len(moved)

    click.echo(f"archived {run(config_path, work)} records to {out}")
