"""`gateway audit archive` never archives the head of the chain, and what it leaves verifies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from click.testing import CliRunner

from gateway.cli.main import cli
from tests.cli.test_audit_tamper import write_records

MODELS = [{"name": "m", "deployments": [{"name": "d", "api_base": "http://127.0.0.1:9/v1", "model": "m"}]}]


def config_with_records(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"store": {"kind": "embedded", "path": str(tmp_path / "data")}, "models": MODELS}))
    asyncio.run(write_records(path, count))
    return path


def audit(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["audit", *args])
    return result.exit_code, result.output


def test_archiving_up_to_the_head_is_refused_and_moves_nothing(tmp_path: Path) -> None:
    config = config_with_records(tmp_path, 5)
    out = tmp_path / "archive.jsonl"
    code, output = audit("archive", "--config", str(config), "--before-seq", "100000", "--out", str(out))
    assert code == 1
    assert "head of the chain" in output, output
    assert "seq 5" in output, output
    assert not out.exists()
    code, output = audit("verify", "--config", str(config))
    assert (code, "ok, 5 records verified" in output) == (0, True), output


def test_keep_last_archives_the_rest_and_both_verify_as_one_chain(tmp_path: Path) -> None:
    config = config_with_records(tmp_path, 5)
    out = tmp_path / "archive.jsonl"
    code, output = audit("archive", "--config", str(config), "--keep-last", "2", "--out", str(out))
    assert (code, output.strip()) == (0, f"archived 3 records to {out}")
    code, output = audit("verify", "--config", str(config), "--archive", str(out))
    assert code == 0, output
    assert "store: ok, 2 records verified" in output


def test_nothing_to_archive_still_leaves_a_file_that_verifies(tmp_path: Path) -> None:
    config = config_with_records(tmp_path, 3)
    out = tmp_path / "archive.jsonl"
    code, output = audit("archive", "--config", str(config), "--keep-last", "1000", "--out", str(out))
    assert (code, output.strip()) == (0, f"archived 0 records to {out}")
    code, output = audit("verify", "--config", str(config), "--archive", str(out))
    assert code == 0, output
