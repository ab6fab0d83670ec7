"""save_checkpoint stages, writes the manifest last, renames atomically, prunes and registers.

The torch DCP writer is replaced by a fake that writes the DCP layout (`.metadata` plus
`__<rank>_0.distcp` shards): what is under test is our staging and bookkeeping, not torch.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from checkpoints.manifest import CheckpointFormat, read_manifest
from checkpoints.registry import CheckpointRegistry, RegistryError, verify
from checkpoints.training import TrainingExtraMissingError, save_checkpoint, step_dirs


def fake_dcp_writer(directory: Path) -> None:
    (directory / "__0_0.distcp").write_bytes(b"rank0" * 10)
    (directory / "__1_0.distcp").write_bytes(b"rank1" * 10)
    (directory / ".metadata").write_bytes(b"metadata")


def visible_checkpoints(run_dir: Path) -> list[str]:
    return [path.name for _step, path in step_dirs(run_dir)]


def test_sync_save_lands_complete_checkpoint_and_registers_it(tmp_path: Path) -> None:
    registry = CheckpointRegistry(tmp_path / "registry")
    saved = save_checkpoint(
        {}, tmp_path / "ckpts", "llama-ft", 1200, registry=registry, writer=fake_dcp_writer
    ).result()
    assert saved.path == tmp_path / "ckpts" / "llama-ft" / "step-1200"
    assert saved.version == "llama-ft@1200"
    assert sorted(p.name for p in (tmp_path / "ckpts" / "llama-ft").iterdir()) == ["step-1200"]
    assert verify(saved.path).ok
    assert read_manifest(saved.path).format is CheckpointFormat.DCP
    assert registry.get("llama-ft@1200").path == str(saved.path)


def test_staging_is_never_visible_as_a_checkpoint_before_completion(tmp_path: Path) -> None:
    run_dir = tmp_path / "ckpts" / "run"
    release = threading.Event()
    seen_while_writing: list[list[str]] = []
    manifest_during_write: list[bool] = []

    def slow_async_writer(directory: Path) -> Future[None]:
        fake_dcp_writer(directory)
        pending: Future[None] = Future()

        def finish() -> None:
            release.wait(timeout=10)
            pending.set_result(None)

        threading.Thread(target=finish).start()
        return pending

    handle = save_checkpoint({}, tmp_path / "ckpts", "run", 7, writer=slow_async_writer)
    seen_while_writing.append(visible_checkpoints(run_dir))
    manifest_during_write.append((run_dir / ".staging-7" / "manifest.json").exists())
    assert not handle.done()
    release.set()
    saved = handle.result(timeout=10)
    assert seen_while_writing == [[]]
    assert manifest_during_write == [False]
    assert visible_checkpoints(run_dir) == ["step-7"]
    assert not (run_dir / ".staging-7").exists()
    assert verify(saved.path).ok


def test_writer_failure_leaves_no_checkpoint_no_staging_and_no_registration(tmp_path: Path) -> None:
    registry = CheckpointRegistry(tmp_path / "registry")

    def failing_writer(directory: Path) -> None:
        (directory / "__0_0.distcp").write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({}, tmp_path / "ckpts", "run", 3, registry=registry, writer=failing_writer)
    assert list((tmp_path / "ckpts" / "run").iterdir()) == []
    assert registry.list() == []


def test_async_writer_failure_is_raised_from_the_handle_and_staging_removed(tmp_path: Path) -> None:
    def failing_async_writer(directory: Path) -> Future[None]:
        pending: Future[None] = Future()
        pending.set_exception(RuntimeError("rank 1 died"))
        return pending

    handle = save_checkpoint({}, tmp_path / "ckpts", "run", 3, writer=failing_async_writer)
    with pytest.raises(RuntimeError, match="rank 1 died"):
        handle.result(timeout=10)
    assert list((tmp_path / "ckpts" / "run").iterdir()) == []


def test_leftover_staging_from_a_crashed_save_is_replaced(tmp_path: Path) -> None:
    staging = tmp_path / "ckpts" / "run" / ".staging-5"
    staging.mkdir(parents=True)
    (staging / "__9_0.distcp").write_bytes(b"stale shard")
    saved = save_checkpoint({}, tmp_path / "ckpts", "run", 5, writer=fake_dcp_writer).result()
    assert not (saved.path / "__9_0.distcp").exists()
    assert verify(saved.path).ok


def test_saving_an_existing_step_is_refused(tmp_path: Path) -> None:
    save_checkpoint({}, tmp_path, "run", 1, writer=fake_dcp_writer).result()
    with pytest.raises(FileExistsError):
        save_checkpoint({}, tmp_path, "run", 1, writer=fake_dcp_writer)


def test_keep_last_prunes_oldest_complete_checkpoints_and_their_versions(tmp_path: Path) -> None:
    registry = CheckpointRegistry(tmp_path / "registry")
    run_dir = tmp_path / "ckpts" / "run"
    pruned: list[str] = []
    for step in (100, 200, 300, 400):
        saved = save_checkpoint(
            {}, tmp_path / "ckpts", "run", step, keep_last=2, registry=registry, writer=fake_dcp_writer
        ).result()
        pruned.extend(path.name for path in saved.pruned)
    assert visible_checkpoints(run_dir) == ["step-300", "step-400"]
    assert pruned == ["step-100", "step-200"]
    assert [entry.version for entry in registry.list("run")] == ["run@300", "run@400"]
    latest = registry.latest_valid("run").entry
    assert latest is not None
    assert latest.version == "run@400"


def test_pruning_ignores_incomplete_directories(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "step-1").mkdir(parents=True)  # no manifest: not a complete checkpoint
    (run_dir / ".staging-9").mkdir()  # another save still in flight
    save_checkpoint({}, tmp_path, "run", 2, keep_last=1, writer=fake_dcp_writer).result()
    save_checkpoint({}, tmp_path, "run", 3, keep_last=1, writer=fake_dcp_writer).result()
    assert sorted(p.name for p in run_dir.iterdir()) == [".staging-9", "step-1", "step-3"]


def test_keep_last_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint({}, tmp_path, "run", 1, keep_last=0, writer=fake_dcp_writer)


def test_missing_torch_names_the_extra_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes any import of the name fail, whether or not torch is installed (or was
    # already imported by another test in this process).
    for name in ["torch", "torch.distributed", "torch.distributed.checkpoint"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(TrainingExtraMissingError, match=r"pip install 'agent-gateway\[train\]'"):
        save_checkpoint({}, tmp_path, "run", 1)
    assert not (tmp_path / "run").exists()


def test_bad_run_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(RegistryError):
        save_checkpoint({}, tmp_path, "a/b", 1, writer=fake_dcp_writer)
    assert list(tmp_path.iterdir()) == []
