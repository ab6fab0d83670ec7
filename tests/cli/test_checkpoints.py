"""`gateway checkpoints register | verify | list | latest-valid`: output and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from gateway.cli.checkpoints import checkpoints_group
from tests.checkpoints.fixtures import make_dcp, make_gguf, make_safetensors


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "registry"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(checkpoints_group, list(args))


def register(root: Path, path: Path, run: str, step: int) -> Result:
    return invoke("register", str(path), "--run", run, "--step", str(step), "--root", str(root))


def test_register_prints_version_and_writes_manifest(root: Path, tmp_path: Path) -> None:
    checkpoint = make_dcp(tmp_path / "ck")
    result = register(root, checkpoint, "llama-ft", 1200)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("registered llama-ft@1200 (torch-dcp) sha256:")
    assert (checkpoint / "manifest.json").is_file()


def test_register_gguf_file_writes_manifest_beside_it(root: Path, tmp_path: Path) -> None:
    model = make_gguf(tmp_path / "m.gguf")
    result = register(root, model, "quant", 1)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m.gguf.manifest.json").is_file()


def test_register_unknown_layout_exits_1(root: Path, tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "readme.txt").write_text("x")
    result = register(root, tmp_path / "junk", "run", 1)
    assert result.exit_code == 1
    assert "not a DCP" in result.output


def test_register_duplicate_version_exits_1(root: Path, tmp_path: Path) -> None:
    register(root, make_dcp(tmp_path / "a"), "run", 1)
    result = register(root, make_dcp(tmp_path / "b"), "run", 1)
    assert result.exit_code == 1
    assert "already registered" in result.output


def test_verify_ok_exits_0(root: Path, tmp_path: Path) -> None:
    register(root, make_dcp(tmp_path / "ck"), "run", 1)
    result = invoke("verify", "run@1", "--root", str(root))
    assert result.exit_code == 0
    assert result.output == "ok run@1: 3 files match the manifest\n"


def test_verify_names_every_broken_file_and_exits_1(root: Path, tmp_path: Path) -> None:
    checkpoint = make_safetensors(tmp_path / "hf")
    register(root, checkpoint, "run", 1)
    (checkpoint / "config.json").unlink()
    (checkpoint / "model-00001-of-00002.safetensors").write_bytes(b"a" * 63 + b"A")
    (checkpoint / "model-00002-of-00002.safetensors").write_bytes(b"b")
    (checkpoint / "optimizer.pt").write_bytes(b"o")
    result = invoke("verify", "run@1", "--root", str(root))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert "missing: config.json" in lines
    assert "changed: model-00001-of-00002.safetensors (sha256 differs from manifest)" in lines
    assert "truncated: model-00002-of-00002.safetensors (1 bytes, manifest says 64)" in lines
    assert "unexpected: optimizer.pt (not in manifest)" in lines
    assert "FAILED run@1: 4 problem(s)" in result.stderr


def test_verify_unknown_version_exits_1(root: Path) -> None:
    result = invoke("verify", "ghost@1", "--root", str(root))
    assert result.exit_code == 1
    assert "unknown version 'ghost@1'" in result.output


def test_list_shows_a_table_filtered_by_run(root: Path, tmp_path: Path) -> None:
    register(root, make_dcp(tmp_path / "a1"), "alpha", 1)
    register(root, make_safetensors(tmp_path / "b2"), "beta", 2)
    result = invoke("list", "--run", "beta", "--root", str(root))
    assert result.exit_code == 0
    header, *rows = result.output.splitlines()
    assert header.split() == ["VERSION", "STEP", "FORMAT", "REGISTERED", "PATH"]
    assert len(rows) == 1
    assert rows[0].split()[:3] == ["beta@2", "2", "hf-safetensors"]


def test_list_of_empty_registry_says_so(root: Path) -> None:
    result = invoke("list", "--root", str(root))
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no checkpoints registered" in result.stderr


def test_latest_valid_skips_broken_newer_and_says_why(root: Path, tmp_path: Path) -> None:
    register(root, make_dcp(tmp_path / "s1"), "run", 100)
    newer = make_dcp(tmp_path / "s2")
    register(root, newer, "run", 200)
    (newer / "manifest.json").unlink()
    result = invoke("latest-valid", "--run", "run", "--root", str(root))
    assert result.exit_code == 0
    assert result.stdout == f"run@100\t{tmp_path / 's1'}\n"
    assert "skipping run@200: no-manifest: manifest.json (checkpoint incomplete)" in result.stderr


def test_latest_valid_exits_1_when_nothing_verifies(root: Path, tmp_path: Path) -> None:
    checkpoint = make_dcp(tmp_path / "s1")
    register(root, checkpoint, "run", 1)
    (checkpoint / ".metadata").unlink()
    result = invoke("latest-valid", "--root", str(root))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "skipping run@1: missing: .metadata" in result.stderr
    assert "no valid checkpoint" in result.stderr


def test_latest_valid_with_empty_registry_exits_1(root: Path) -> None:
    result = invoke("latest-valid", "--root", str(root))
    assert result.exit_code == 1


def test_a_gateway_config_names_the_registry_like_for_every_other_command(root: Path, tmp_path: Path) -> None:
    register(root, make_dcp(tmp_path / "a1"), "alpha", 1)
    config = tmp_path / "gw.yaml"
    deployment = {"name": "a", "api_base": "http://127.0.0.1:9/v1", "model": "m"}
    config.write_text(
        yaml.safe_dump(
            {
                "models": [{"name": "m", "deployments": [deployment]}],
                "releases": {"checkpoint_registry": str(root)},
            }
        )
    )
    listed = invoke("list", "--config", str(config))
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[1].split()[0] == "alpha@1"
    assert invoke("verify", "alpha@1", "--config", str(config)).exit_code == 0
    other = invoke("list", "--config", str(config), "--root", str(tmp_path / "elsewhere"))
    assert other.exit_code == 2, other.output
    assert "is not the registry" in other.output
