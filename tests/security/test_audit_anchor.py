"""Issue 11, Low: audit verify missed tail truncation (deleting the newest records still verified
"ok") and the chain was unkeyed (an edited chain, re-hashed, verified). Issue 16 item 11: an
exported audit file must verify on its own (`gateway audit verify --file export.jsonl`).

Verify now checks the chain reaches the store's head mark; with `audit.hmac_key` set (from the
environment, never the store) every record is an HMAC, and `gateway audit head` prints a signed
head mark to keep elsewhere, which `audit verify --head` checks."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml
from click.testing import CliRunner, Result

from gateway.assembly.foundation import build_audit_writer
from gateway.cli.main import cli
from gateway.settings import load_settings
from gateway.store.factory import open_store
from testkit.procs import delete_redis_prefix, redis_store_config
from tests.cli.test_audit_tamper import Records, rewrite

AUDIT_KEY = "k" * 40
ENV = {"GATEWAY_AUDIT_KEY": AUDIT_KEY}


def make_config(tmp_path: Path, kind: str, prefix: str, keyed: bool) -> Path:
    store = {"kind": "embedded", "path": str(tmp_path / "data")} if kind == "embedded" else redis_store_config(prefix)
    config: dict[str, Any] = {
        "store": store,
        "models": [{"name": "m", "deployments": [{"name": "d", "api_base": "http://127.0.0.1:9/v1", "model": "m"}]}],
    }
    if keyed:
        config["audit"] = {"hmac_key": "${GATEWAY_AUDIT_KEY}"}
    path = tmp_path / f"gateway-{'keyed' if keyed else 'plain'}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(autouse=True)
def audit_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key lives in the environment, as in production (tests/cli's `rewrite` reads the config)."""
    monkeypatch.setenv("GATEWAY_AUDIT_KEY", AUDIT_KEY)


@pytest.fixture(params=["embedded", "redis"])
def configs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(plain config, keyed config) over one store."""
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    try:
        yield (
            make_config(tmp_path, request.param, prefix, keyed=False),
            make_config(tmp_path, request.param, prefix, keyed=True),
        )
    finally:
        delete_redis_prefix(prefix)


async def write_records(path: Path, count: int) -> None:
    settings = load_settings(path, env=ENV)
    store = open_store(settings.store)
    writer = build_audit_writer(settings, store)
    try:
        for i in range(count):
            await writer.submit({"kind": "request", "tenant": "acme", "status": 200, "i": i})
        await writer.flush()
    finally:
        await store.aclose()


def gateway(*args: str, key: str = AUDIT_KEY) -> Result:
    return CliRunner(env={"GATEWAY_AUDIT_KEY": key}).invoke(cli, list(args))


def test_tail_truncation_fails_verify(configs: tuple[Path, Path]) -> None:
    plain, _ = configs
    asyncio.run(write_records(plain, 6))
    rewrite(plain, lambda records: records[:4])
    result = gateway("audit", "verify", "--config", str(plain))
    assert result.exit_code == 1, result.output
    assert "truncated" in result.output
    assert "seq 6" in result.output


def rehash_unkeyed(records: Records) -> Records:
    """An attacker without the key: edit a record, then recompute every hash and link with SHA-256."""
    records[2][1]["status"] = 500
    prev = ""
    for _, record in records:
        record.pop("mac", None)
        record["prev"] = prev
        body = {k: v for k, v in record.items() if k != "hash"}
        record["hash"] = prev = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return records


def test_rehashed_chain_fails_verify_with_the_hmac_key(configs: tuple[Path, Path]) -> None:
    _, keyed = configs
    asyncio.run(write_records(keyed, 6))
    assert gateway("audit", "verify", "--config", str(keyed)).exit_code == 0
    rewrite(keyed, rehash_unkeyed)
    result = gateway("audit", "verify", "--config", str(keyed))
    assert result.exit_code == 1, result.output
    assert "TAMPERED at record seq 1" in result.output
    assert "not keyed" in result.output


def test_keyed_chain_does_not_verify_without_the_key(configs: tuple[Path, Path]) -> None:
    plain, keyed = configs
    asyncio.run(write_records(keyed, 3))
    result = gateway("audit", "verify", "--config", str(plain))
    assert result.exit_code == 1, result.output
    assert "audit.hmac_key" in result.output


def truncate_with_head(path: Path, keep: int) -> None:
    """Drop the newest records and rewrite the store's own head mark to match the new last one."""
    kept: list[dict[str, Any]] = []

    def change(records: Records) -> Records:
        kept.extend(record for _, record in records[:keep])
        return records[:keep]

    rewrite(path, change)
    last = kept[-1]
    store = load_settings(path, env=ENV).store
    if store.kind == "embedded":
        db = sqlite3.connect(store.path / "gateway.db")
        db.execute("UPDATE audit_marks SET seq = ?, hash = ? WHERE name = 'head'", (last["seq"], last["hash"]))
        db.commit()
        db.close()
        return
    client = redis.Redis.from_url(store.url)
    client.hset(f"{store.key_prefix}:{{audit}}:head", mapping={"seq": last["seq"], "hash": last["hash"]})
    client.close()


def test_signed_head_mark_kept_elsewhere_catches_a_rollback(configs: tuple[Path, Path], tmp_path: Path) -> None:
    _, keyed = configs
    asyncio.run(write_records(keyed, 6))
    mark = tmp_path / "head.json"
    printed = gateway("audit", "head", "--config", str(keyed))
    assert printed.exit_code == 0, printed.output
    mark.write_text(printed.stdout)
    assert gateway("audit", "verify", "--config", str(keyed), "--head", str(mark)).exit_code == 0
    # An attacker who truncates the records and rewrites the store's own head mark to match:
    # only the mark kept outside the store still knows seq 6.
    truncate_with_head(keyed, 4)
    assert gateway("audit", "verify", "--config", str(keyed)).exit_code == 0  # the store alone cannot tell
    rolled_back = gateway("audit", "verify", "--config", str(keyed), "--head", str(mark))
    assert rolled_back.exit_code == 1, rolled_back.output
    assert "seq 6" in rolled_back.output
    forged = {**orjson.loads(mark.read_text()), "seq": 4}
    mark.write_bytes(orjson.dumps(forged))
    bad_sig = gateway("audit", "verify", "--config", str(keyed), "--head", str(mark))
    assert bad_sig.exit_code == 1, bad_sig.output
    assert "signature" in bad_sig.output


def test_exported_file_verifies_on_its_own(configs: tuple[Path, Path], tmp_path: Path) -> None:
    plain, _ = configs
    asyncio.run(write_records(plain, 8))
    archive = tmp_path / "old.jsonl"
    moved = gateway("audit", "archive", "--config", str(plain), "--before-seq", "4", "--out", str(archive))
    assert moved.exit_code == 0, moved.output
    exported = gateway("audit", "export", "--config", str(plain))
    export = tmp_path / "export.jsonl"
    export.write_text(exported.stdout)
    for path, count in ((export, 5), (archive, 3)):  # a file that starts mid-chain verifies too
        result = gateway("audit", "verify", "--file", str(path), key="")
        assert result.exit_code == 0, result.output
        assert f"{count} records verified" in result.output
    lines = export.read_bytes().splitlines()
    lines[2] = lines[2].replace(b'"status":200', b'"status":201')
    export.write_bytes(b"\n".join(lines) + b"\n")
    broken = gateway("audit", "verify", "--file", str(export), key="")
    assert broken.exit_code == 1
    assert "TAMPERED at record seq 6" in broken.output


def test_keyed_export_needs_the_key_to_verify(configs: tuple[Path, Path], tmp_path: Path) -> None:
    _, keyed = configs
    asyncio.run(write_records(keyed, 3))
    export = tmp_path / "export.jsonl"
    export.write_text(gateway("audit", "export", "--config", str(keyed)).stdout)
    assert gateway("audit", "verify", "--file", str(export), "--config", str(keyed)).exit_code == 0
    without = gateway("audit", "verify", "--file", str(export), key="")
    assert without.exit_code == 1, without.output
    assert "audit.hmac_key" in without.output
