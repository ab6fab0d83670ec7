"""Verification names every kind of damage; the registry finds the newest checkpoint that verifies."""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from checkpoints.manifest import CheckpointFormat
from checkpoints.registry import (
    CheckpointRegistry,
    Problem,
    ProblemKind,
    RegistryError,
    build_manifest,
    verify,
    write_manifest,
)
from tests.checkpoints.fixtures import make_dcp, make_gguf, make_lora, make_safetensors


def sealed_dcp(path: Path) -> Path:
    write_manifest(make_dcp(path), build_manifest(path))
    return path


def kinds(problems: tuple[Problem, ...]) -> set[tuple[ProblemKind, str]]:
    return {(problem.kind, problem.file) for problem in problems}


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
def registry(tmp_path: Path) -> CheckpointRegistry:
    return CheckpointRegistry(tmp_path / "registry", clock=Clock())


def test_untouched_checkpoint_verifies(tmp_path: Path) -> None:
    report = verify(sealed_dcp(tmp_path / "ck"))
    assert report.ok
    assert report.problems == ()


def test_bit_flip_is_named_as_changed(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    shard = checkpoint / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[17] ^= 0x01
    shard.write_bytes(bytes(data))
    report = verify(checkpoint)
    assert not report.ok
    assert kinds(report.problems) == {(ProblemKind.CHANGED, "__1_0.distcp")}


def test_truncated_file_is_named_as_truncated(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    shard = checkpoint / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:10])
    assert kinds(verify(checkpoint).problems) == {(ProblemKind.TRUNCATED, "__1_0.distcp")}


def test_deleted_file_is_named_as_missing(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    (checkpoint / ".metadata").unlink()
    assert kinds(verify(checkpoint).problems) == {(ProblemKind.MISSING, ".metadata")}


def test_extra_file_is_named_as_unexpected(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    (checkpoint / "__2_0.distcp").write_bytes(b"stray")
    assert kinds(verify(checkpoint).problems) == {(ProblemKind.UNEXPECTED, "__2_0.distcp")}


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    (checkpoint / ".metadata").unlink()
    (checkpoint / "__0_0.distcp").write_bytes(b"shard-ZERO")
    (checkpoint / "__1_0.distcp").write_bytes(b"short")
    (checkpoint / "notes.txt").write_text("hi")
    assert kinds(verify(checkpoint).problems) == {
        (ProblemKind.MISSING, ".metadata"),
        (ProblemKind.CHANGED, "__0_0.distcp"),
        (ProblemKind.TRUNCATED, "__1_0.distcp"),
        (ProblemKind.UNEXPECTED, "notes.txt"),
    }


def test_edited_manifest_fails_its_digest(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    manifest = checkpoint / "manifest.json"
    payload = json.loads(manifest.read_text())
    payload["files"][1]["size"] = 11
    manifest.write_text(json.dumps(payload))
    report = verify(checkpoint)
    assert (ProblemKind.DIGEST_MISMATCH, "manifest.json") in kinds(report.problems)


def test_unparseable_manifest_is_reported(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    (checkpoint / "manifest.json").write_text("{not json")
    assert kinds(verify(checkpoint).problems) == {(ProblemKind.INVALID_MANIFEST, "manifest.json")}


def test_directory_without_manifest_is_not_complete(tmp_path: Path) -> None:
    report = verify(make_dcp(tmp_path / "ck"))
    assert kinds(report.problems) == {(ProblemKind.NO_MANIFEST, "manifest.json")}


def test_deleted_gguf_file_is_missing(tmp_path: Path) -> None:
    model = make_gguf(tmp_path / "m.gguf")
    write_manifest(model, build_manifest(model))
    model.unlink()
    assert kinds(verify(model).problems) == {(ProblemKind.MISSING, "m.gguf")}


def test_register_writes_manifest_and_records_version(registry: CheckpointRegistry, tmp_path: Path) -> None:
    checkpoint = make_safetensors(tmp_path / "hf")
    entry = registry.register(checkpoint, "llama-ft", 1200)
    assert entry.version == "llama-ft@1200"
    assert (checkpoint / "manifest.json").is_file()
    assert entry.format is CheckpointFormat.SAFETENSORS
    assert entry.manifest_digest == build_manifest(checkpoint).digest
    assert registry.get("llama-ft@1200") == entry
    assert registry.verify("llama-ft@1200").ok


def test_register_survives_a_new_registry_instance(registry: CheckpointRegistry, tmp_path: Path) -> None:
    entry = registry.register(make_lora(tmp_path / "lora"), "adapter", 5)
    assert CheckpointRegistry(registry.root).get("adapter@5") == entry


def test_register_refuses_duplicate_version(registry: CheckpointRegistry, tmp_path: Path) -> None:
    registry.register(sealed_dcp(tmp_path / "a"), "run", 1)
    with pytest.raises(RegistryError, match="already registered"):
        registry.register(sealed_dcp(tmp_path / "b"), "run", 1)


def test_register_refuses_checkpoint_whose_manifest_does_not_verify(
    registry: CheckpointRegistry, tmp_path: Path
) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    (checkpoint / "__0_0.distcp").write_bytes(b"tampered!!")
    with pytest.raises(RegistryError, match="changed"):
        registry.register(checkpoint, "run", 1)
    assert registry.list() == []


@pytest.mark.parametrize("run", ["a@b", "a/b", ""])
def test_register_rejects_run_names_that_break_version_ids(
    registry: CheckpointRegistry, tmp_path: Path, run: str
) -> None:
    with pytest.raises(RegistryError):
        registry.register(sealed_dcp(tmp_path / "ck"), run, 1)


def test_unknown_version_is_an_error(registry: CheckpointRegistry) -> None:
    with pytest.raises(RegistryError, match="unknown version"):
        registry.get("nope@1")


def test_consistently_rewritten_manifest_fails_against_registry_digest(
    registry: CheckpointRegistry, tmp_path: Path
) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    registry.register(checkpoint, "run", 1)
    (checkpoint / "__0_0.distcp").write_bytes(b"swapped")
    write_manifest(checkpoint, build_manifest(checkpoint))  # digest is self-consistent again
    assert verify(checkpoint).ok
    assert kinds(registry.verify("run@1").problems) == {(ProblemKind.DIGEST_MISMATCH, "manifest.json")}


def test_list_filters_by_run_and_orders_by_step(registry: CheckpointRegistry, tmp_path: Path) -> None:
    registry.register(sealed_dcp(tmp_path / "a20"), "a", 20)
    registry.register(sealed_dcp(tmp_path / "b1"), "b", 1)
    registry.register(sealed_dcp(tmp_path / "a3"), "a", 3)
    assert [entry.version for entry in registry.list(run="a")] == ["a@3", "a@20"]
    assert [entry.version for entry in registry.list()] == ["a@3", "a@20", "b@1"]


def test_latest_valid_skips_broken_newer_checkpoint(registry: CheckpointRegistry, tmp_path: Path) -> None:
    registry.register(sealed_dcp(tmp_path / "s100"), "run", 100)
    newer = sealed_dcp(tmp_path / "s200")
    registry.register(newer, "run", 200)
    (newer / "__1_0.distcp").unlink()
    result = registry.latest_valid("run")
    assert result.entry is not None
    assert result.entry.version == "run@100"
    assert [(entry.version, kinds(report.problems)) for entry, report in result.skipped] == [
        ("run@200", {(ProblemKind.MISSING, "__1_0.distcp")})
    ]


def test_latest_valid_skips_checkpoint_whose_manifest_vanished(registry: CheckpointRegistry, tmp_path: Path) -> None:
    registry.register(sealed_dcp(tmp_path / "s1"), "run", 1)
    newer = sealed_dcp(tmp_path / "s2")
    registry.register(newer, "run", 2)
    (newer / "manifest.json").unlink()
    result = registry.latest_valid()
    assert result.entry is not None
    assert result.entry.version == "run@1"
    assert kinds(result.skipped[0][1].problems) == {(ProblemKind.NO_MANIFEST, "manifest.json")}


def test_latest_valid_orders_by_step_not_registration_time(registry: CheckpointRegistry, tmp_path: Path) -> None:
    registry.register(sealed_dcp(tmp_path / "s9"), "run", 9)
    registry.register(sealed_dcp(tmp_path / "s3"), "run", 3)
    result = registry.latest_valid("run")
    assert result.entry is not None
    assert result.entry.version == "run@9"


def test_latest_valid_breaks_step_ties_by_registration_time(registry: CheckpointRegistry, tmp_path: Path) -> None:
    registry.register(sealed_dcp(tmp_path / "first"), "a", 5)
    registry.register(sealed_dcp(tmp_path / "second"), "b", 5)
    result = registry.latest_valid()
    assert result.entry is not None
    assert result.entry.version == "b@5"


def test_latest_valid_is_none_when_nothing_verifies(registry: CheckpointRegistry, tmp_path: Path) -> None:
    broken = sealed_dcp(tmp_path / "s1")
    registry.register(broken, "run", 1)
    (broken / "extra").write_text("x")
    result = registry.latest_valid("run")
    assert result.entry is None
    assert len(result.skipped) == 1


def _register_in_subprocess(root: str, checkpoint: str, step: int) -> str:
    return CheckpointRegistry(Path(root)).register(Path(checkpoint), "run", step).version


def test_concurrent_registers_from_processes_all_land(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    checkpoints = [sealed_dcp(tmp_path / f"s{step}") for step in range(8)]
    with ProcessPoolExecutor(max_workers=4, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [
            pool.submit(_register_in_subprocess, str(root), str(ck), step) for step, ck in enumerate(checkpoints)
        ]
        versions = {future.result() for future in futures}
    assert versions == {f"run@{step}" for step in range(8)}
    assert {entry.version for entry in CheckpointRegistry(root).list()} == versions


def test_a_file_that_grew_is_named_as_grown_not_truncated(tmp_path: Path) -> None:
    checkpoint = sealed_dcp(tmp_path / "ck")
    shard = checkpoint / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes() + b"appended")
    [problem] = verify(checkpoint).problems
    assert (problem.kind, problem.file) == (ProblemKind.GROWN, "__1_0.distcp")
    assert str(problem).startswith("grown: __1_0.distcp")
