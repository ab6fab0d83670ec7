"""Issue 11, Low: checkpoint manifests could name files outside the checkpoint, and a symlink to
/dev/zero made `gateway checkpoints register` hang. Manifest paths are confined to the checkpoint,
special files (devices, FIFOs, sockets) and links leading out of it are refused, reads are bounded.

The CLI runs in a child process with a timeout, so a regression hangs that child, not the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from checkpoints.manifest import FileEntry, build_manifest, read_manifest, write_manifest
from checkpoints.registry import CheckpointRegistry, ProblemKind, verify
from tests.checkpoints.fixtures import make_gguf, make_safetensors


def checkpoints(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "checkpoints", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"gateway checkpoints {' '.join(args)} hung")


@pytest.mark.parametrize("special", ["dev-zero-symlink", "fifo"])
def test_register_refuses_a_special_file_instead_of_hanging(tmp_path: Path, special: str) -> None:
    checkpoint = make_safetensors(tmp_path / "ckpt")
    if special == "fifo":
        os.mkfifo(checkpoint / "extra.bin")
    else:
        (checkpoint / "extra.bin").symlink_to("/dev/zero")
    done = checkpoints("register", str(checkpoint), "--run", "r", "--step", "1", "--root", str(tmp_path / "reg"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "extra.bin" in done.stderr
    assert "not a regular file" in done.stderr or "outside the checkpoint" in done.stderr


def test_register_refuses_a_symlink_leading_out_of_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = make_safetensors(tmp_path / "ckpt")
    (tmp_path / "secret.txt").write_text("outside")
    (checkpoint / "peek.json").symlink_to(tmp_path / "secret.txt")
    done = checkpoints("register", str(checkpoint), "--run", "r", "--step", "1", "--root", str(tmp_path / "reg"))
    assert done.returncode == 1
    assert "peek.json" in done.stderr
    assert "outside the checkpoint" in done.stderr


def forge_manifest(checkpoint: Path, path: str) -> None:
    """A manifest rewritten consistently (digest included) to list a file outside the checkpoint."""
    manifest = read_manifest(checkpoint)
    extra = FileEntry(path=path, size=7, sha256="0" * 64)
    forged = manifest.model_copy(update={"files": (*manifest.files, extra)}).sealed()
    write_manifest(checkpoint, forged)


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/hostname", "sub/../../secret.txt", "./../secret.txt"])
def test_manifest_naming_a_file_outside_the_checkpoint_is_refused(tmp_path: Path, path: str) -> None:
    checkpoint = make_safetensors(tmp_path / "ckpt")
    write_manifest(checkpoint, build_manifest(checkpoint))
    (tmp_path / "secret.txt").write_text("outside")
    with pytest.raises(ValueError, match="inside the checkpoint"):
        FileEntry(path=path, size=7, sha256="0" * 64)
    raw = orjson.loads((checkpoint / "manifest.json").read_bytes())
    raw["files"].append({"path": path, "size": 7, "sha256": "0" * 64})
    (checkpoint / "manifest.json").write_bytes(orjson.dumps(raw))
    report = verify(checkpoint)
    assert not report.ok
    assert report.problems[0].kind is ProblemKind.INVALID_MANIFEST


def test_gguf_manifest_may_name_only_its_own_file(tmp_path: Path) -> None:
    model = make_gguf(tmp_path / "m.gguf")
    (tmp_path / "neighbour.bin").write_text("outside")
    write_manifest(model, build_manifest(model))
    forge_manifest(model, "neighbour.bin")
    report = verify(model)
    assert any(p.kind is ProblemKind.UNSAFE and p.file == "neighbour.bin" for p in report.problems), report.problems


def test_verify_after_a_file_is_swapped_for_dev_zero_answers(tmp_path: Path) -> None:
    checkpoint = make_safetensors(tmp_path / "ckpt")
    CheckpointRegistry(tmp_path / "reg").register(checkpoint, "r", 1)
    victim = checkpoint / "config.json"
    victim.unlink()
    victim.symlink_to("/dev/zero")
    done = checkpoints("verify", "r@1", "--root", str(tmp_path / "reg"))
    assert done.returncode == 1
    assert "unsafe: config.json" in done.stdout
