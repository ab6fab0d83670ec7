"""`gateway audit verify | export | archive`, on the store named by --config."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson

from gateway.audit.writer import Verdict, check_head, head_mark, iterate, verify_records
from gateway.cli.context import CliContext, config_option, run
from gateway.errors import StoreCorrupt
from gateway.store.audit_batch import canonical
from gateway.store.base import AuditHead, AuditRecord


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


def _read_archive(path: Path) -> list[AuditRecord]:
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    try:
        return [AuditRecord.from_json(line) for line in lines]
    except ValueError as error:  # orjson's JSONDecodeError is one too
        click.echo(f"{path}: TAMPERED: a line is not an audit record: {error}", err=True)
        sys.exit(1)


def _report(verdict: Verdict, where: str) -> None:
    if verdict.ok:
        click.echo(f"{where}: ok, {verdict.checked} records verified")
        return
    click.echo(f"{where}: TAMPERED at record seq {verdict.first_bad_seq}: {verdict.reason}", err=True)
    sys.exit(1)


@click.group("audit")
def audit_group() -> None:
    """Verify, export and archive the hash-chained audit log."""


_KEY_ENV = "GATEWAY_AUDIT_KEY"


@audit_group.command("verify")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="the gateway config whose store to verify (and whose audit.hmac_key to use)",
)
@click.option(
    "--archive",
    "archives",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="archived records (oldest first) to verify in front of the store's records",
)
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="an exported or archived JSONL file to verify on its own (no store needed)",
)
@click.option(
    "--head",
    "head_path",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="a head mark printed earlier by `gateway audit head` and kept outside the store",
)
def verify_command(
    config_path: Path | None, archives: tuple[Path, ...], files: tuple[Path, ...], head_path: Path | None
) -> None:
    """Recompute the chain; name the first changed, deleted, inserted, reordered or truncated record.

    With a keyed chain the key is the config's audit.hmac_key, or GATEWAY_AUDIT_KEY without --config."""
    key = _audit_key(config_path)
    for path in files:
        records = _read_archive(path)
        # A file may start anywhere in the chain: its first record says where it links on.
        start = AuditHead(records[0].seq - 1, records[0].prev) if records else AuditHead(0, "")
        _report(verify_records(records, start, key), str(path))
    if config_path is None:
        if not files:
            raise click.UsageError("name a store with --config, or files with --file")
        return

    async def work(ctx: CliContext) -> tuple[list[AuditRecord], AuditHead, AuditHead]:
        head = await ctx.store.audit_head()  # first: records appended meanwhile only add to the chain
        anchor = await ctx.store.audit_anchor()
        try:
            return [r async for r in iterate(ctx.store, anchor.seq + 1)], anchor, head
        except StoreCorrupt as error:  # a stored record whose chain fields were broken
            click.echo(f"store: TAMPERED: a stored record is not an audit record: {error.message}", err=True)
            sys.exit(1)

    records, anchor, head = run(config_path, work)
    start = AuditHead(0, "")
    if archives:
        archived = [r for path in archives for r in _read_archive(path)]
        _report(verify_records(archived, start, key), "archive")
        if archived:
            start = AuditHead(archived[-1].seq, archived[-1].hash)
        if start != anchor:
            click.echo(f"archive ends at seq {start.seq} but the store continues from seq {anchor.seq}", err=True)
            sys.exit(1)
    else:
        start = anchor
    verdict = verify_records(records, start, key)
    if verdict.ok:
        verdict = check_head(head_mark(head, key), records, anchor, key)
    if verdict.ok and head_path is not None:
        try:
            kept = orjson.loads(head_path.read_bytes())
        except orjson.JSONDecodeError:
            kept = None
        verdict = check_head(kept if isinstance(kept, dict) else {}, records, anchor, key)
    _report(verdict, "store")
    _report_wipes(records)


def _report_wipes(records: list[AuditRecord]) -> None:
    """The chain verifies from where it starts, but a store that was wiped started it again: the
    records before are gone, and verifying what is left must not read as "nothing is missing"."""
    wipes = [r for r in records if r.body.get("kind") == "store_wiped"]
    for wipe in wipes:
        click.echo(
            f"store: DISCONTINUITY at record seq {wipe.seq}: the store was wiped (epoch "
            f"{wipe.body.get('previous_epoch')} -> {wipe.body.get('epoch')}); the records of the earlier chain, "
            f"up to seq {wipe.body.get('previous_seq')} at least, are not in this store",
            err=True,
        )
    if wipes:
        sys.exit(1)


@audit_group.command("head")
@config_option
def head_command(config_path: Path) -> None:
    """Print the chain's head mark (signed with audit.hmac_key when set). Keep it outside the store
    (another machine, a ticket, a log service): `audit verify --head FILE` then catches a store whose
    newest records were removed, even with its own head rewritten."""

    async def work(ctx: CliContext) -> dict[str, Any]:
        return head_mark(await ctx.store.audit_head(), ctx.settings.audit.hmac_key.encode())

    click.echo(orjson.dumps(run(config_path, work)).decode())


def _audit_key(config_path: Path | None) -> bytes:
    if config_path is None:
        return os.environ.get(_KEY_ENV, "").encode()
    from gateway.cli.serve import load_or_exit

    return load_or_exit(config_path).audit.hmac_key.encode()


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
            ts = float(record.body.get("ts", 0))
            if (low is None or ts >= low) and (high is None or ts < high):
                sys.stdout.buffer.write(canonical(record.to_dict()) + b"\n")
                count += 1
        return count

    count = run(config_path, work)
    click.echo(f"exported {count} records", err=True)


@audit_group.command("archive")
@config_option
@click.option("--before-seq", type=click.IntRange(min=2), default=None, help="archive records with seq below this")
@click.option("--keep-last", type=click.IntRange(min=1), default=None, help="archive all but the newest N records")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True)
def archive_command(config_path: Path, before_seq: int | None, keep_last: int | None, out: Path) -> None:
    """Move old records to a JSONL file; the store keeps an anchor so the rest still verifies.

    The head of the chain (the newest record) always stays in the store."""
    if (before_seq is None) == (keep_last is None):
        raise click.UsageError("give one of --before-seq and --keep-last")

    async def work(ctx: CliContext) -> int:
        head = await ctx.store.audit_head()
        below = head.seq + 1 - keep_last if keep_last is not None else before_seq
        assert below is not None
        if below > head.seq:
            raise click.ClickException(
                f"refusing to archive the head of the chain: the newest record is seq {head.seq}, so "
                f"--before-seq may be at most {head.seq} (or use --keep-last N)"
            )
        anchor = await ctx.store.audit_anchor()
        moved = [r async for r in iterate(ctx.store, anchor.seq + 1) if r.seq < below]
        verdict = verify_records(moved, anchor, ctx.settings.audit.hmac_key.encode())
        if not verdict.ok:
            raise click.ClickException(
                f"refusing to archive a broken chain: seq {verdict.first_bad_seq}: {verdict.reason}"
            )
        with out.open("ab") as archive:  # created even when empty: `verify --archive` reads it
            archive.write(b"".join(canonical(r.to_dict()) + b"\n" for r in moved))
        if moved:
            last = moved[-1]
            await ctx.store.audit_trim(below, AuditHead(last.seq, last.hash))
        return len(moved)

    click.echo(f"archived {run(config_path, work)} records to {out}")
