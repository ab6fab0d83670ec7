"""`gateway audit verify` finds an edited, deleted, inserted or reordered record in either store."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml
from click.testing import CliRunner

from gateway.audit.writer import AuditWriter
from gateway.cli.main import cli
from gateway.settings import load_settings
from gateway.store.factory import open_store
from testkit.procs import delete_redis_prefix, redis_store_config

Records = list[tuple[int, dict[str, Any]]]  # (position key, record) in chain order


def tamper_edit(records: Records) -> Records:
    records[2][1]["status"] = 500
    return records


def tamper_delete(records: Records) -> Records:
    return records[:2] + records[3:]


def tamper_insert(records: Records) -> Records:
    forged = {**records[2][1], "status": 403}
    return [*records[:2], (0, forged), *records[2:]]


def tamper_reorder(records: Records) -> Records:
    records[1], records[2] = records[2], records[1]
    return records


TAMPERS: dict[str, tuple[Callable[[Records], Records], int]] = {
    "edit": (tamper_edit, 3),
    "delete": (tamper_delete, 3),
    "insert": (tamper_insert, 3),
    "reorder": (tamper_reorder, 2),
}


@pytest.fixture(params=["embedded", "redis"])
def config_path(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    store = (
        {"kind": "embedded", "path": str(tmp_path / "data")}
        if request.param == "embedded"
        else redis_store_config(prefix)
    )
    config = {
        "store": store,
        "models": [{"name": "m", "deployments": [{"name": "d", "api_base": "http://127.0.0.1:9/v1", "model": "m"}]}],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        yield path
    finally:
        delete_redis_prefix(prefix)


async def write_records(path: Path, count: int) -> None:
    store = open_store(load_settings(path).store)
    writer = AuditWriter(store, queue_size=100, batch_size=2, flush_interval_s=0.01)
    try:
        for i in range(count):
            await writer.submit({"kind": "request", "tenant": "acme", "status": 200, "i": i})
        await writer.flush()
    finally:
        await store.aclose()


def rewrite(path: Path, change: Callable[[Records], Records]) -> None:
    """What an attacker with write access to the store does: rewrite the stored records."""
    store = load_settings(path).store
    if store.kind == "embedded":
        db = sqlite3.connect(store.path / "gateway.db")
        rows = [
            (seq, orjson.loads(raw)) for seq, raw in db.execute("SELECT seq, record FROM audit_records ORDER BY seq")
        ]
        db.execute("DELETE FROM audit_records")
        for position, (_, record) in enumerate(change(rows), start=1):
            db.execute("INSERT INTO audit_records (seq, record) VALUES (?, ?)", (position, orjson.dumps(record)))
        db.commit()
        db.close()
        return
    client = redis.Redis.from_url(store.url)
    stream = f"{store.key_prefix}:{{audit}}:stream"
    entries = []
    for _, fields in client.xrange(stream) or []:  # typed Optional by redis-py; a missing stream reads []
        assert fields is not None
        entries.append((0, orjson.loads(fields[b"r"])))
    client.delete(stream)
    for position, (_, record) in enumerate(change(entries), start=1):
        client.xadd(stream, {"r": orjson.dumps(record, option=orjson.OPT_SORT_KEYS)}, id=f"{position}-0")
    client.close()


def test_untouched_log_verifies(config_path: Path) -> None:
    asyncio.run(write_records(config_path, 6))
    result = CliRunner().invoke(cli, ["audit", "verify", "--config", str(config_path)])
    assert result.exit_code == 0, result.output
    assert "6 records verified" in result.output


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_tampered_log_fails_at_the_first_bad_record(config_path: Path, tamper: str) -> None:
    change, first_bad = TAMPERS[tamper]
    asyncio.run(write_records(config_path, 6))
    rewrite(config_path, change)
    result = CliRunner().invoke(cli, ["audit", "verify", "--config", str(config_path)])
    assert result.exit_code == 1, result.output
    assert f"TAMPERED at record seq {first_bad}" in result.output


def test_archive_keeps_the_chain_verifiable_across_the_boundary(config_path: Path, tmp_path: Path) -> None:
    asyncio.run(write_records(config_path, 8))
    archive = tmp_path / "archive.jsonl"
    runner = CliRunner()
    moved = runner.invoke(
        cli, ["audit", "archive", "--config", str(config_path), "--before-seq", "5", "--out", str(archive)]
    )
    assert moved.exit_code == 0, moved.output
    assert "archived 4 records" in moved.output
    live = runner.invoke(cli, ["audit", "verify", "--config", str(config_path)])
    both = runner.invoke(cli, ["audit", "verify", "--config", str(config_path), "--archive", str(archive)])
    assert live.exit_code == 0, live.output
    assert both.exit_code == 0, both.output
    lines = archive.read_bytes().splitlines()
    lines[1] = lines[1].replace(b'"status":200', b'"status":201')
    archive.write_bytes(b"\n".join(lines) + b"\n")
    broken = runner.invoke(cli, ["audit", "verify", "--config", str(config_path), "--archive", str(archive)])
    assert broken.exit_code == 1
    assert "TAMPERED at record seq 2" in broken.output


def test_export_writes_records_that_verify(config_path: Path) -> None:
    asyncio.run(write_records(config_path, 3))
    result = CliRunner().invoke(cli, ["audit", "export", "--config", str(config_path)])
    assert result.exit_code == 0
    lines = [orjson.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["seq"] for r in lines] == [1, 2, 3]
