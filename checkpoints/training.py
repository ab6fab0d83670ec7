"""Training-side checkpoint saving: staged, manifest-last, atomically renamed, pruned, registered.

Layout under `<root>/<run>/`: `.staging-<step>` while files are written, `step-<step>` once
complete. A reader that only looks at `step-*` directories never sees a half-written checkpoint.
torch is imported only when the default writer is used: it is the optional `train` extra.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from checkpoints.manifest import build_manifest, fsync_dir, manifest_path, write_manifest
from checkpoints.registry import CheckpointRegistry, RegistryEntry, validate_run_step, version_id

STAGING_PREFIX = ".staging-"
STEP_PREFIX = "step-"
_STEP_DIR = re.compile(r"^step-(\d+)$")
TRAIN_EXTRA_HINT = "pip install 'agent-gateway[train]'"


class TrainingExtraMissingError(RuntimeError):
    """torch (the `train` extra) is needed for the default checkpoint writer."""


class _Pending(Protocol):
    """What an asynchronous writer returns: anything with a blocking result()."""

    def result(self) -> Any: ...


# Writes the checkpoint's files into the given (empty, existing) directory. Returns None when
# the files are complete on return, or a pending object whose result() waits for them.
Writer = Callable[[Path], "_Pending | None"]


@dataclass(frozen=True)
class SavedCheckpoint:
    path: Path
    version: str
    entry: RegistryEntry | None
    pruned: tuple[Path, ...]


def torch_dcp_writer(state_dict: Mapping[str, Any], use_async: bool = True) -> Writer:
    """The default writer: torch.distributed.checkpoint, async_save when this torch has it."""
    try:
        # import_module, not `import`: torch is an optional extra mypy may not have installed.
        dcp = importlib.import_module("torch.distributed.checkpoint")
    except ImportError as exc:
        raise TrainingExtraMissingError(f"saving checkpoints needs torch: {TRAIN_EXTRA_HINT}") from exc

    def write(directory: Path) -> _Pending | None:
        if use_async and hasattr(dcp, "async_save"):
            pending: _Pending = dcp.async_save(state_dict, checkpoint_id=str(directory))
            return pending
        dcp.save(state_dict, checkpoint_id=str(directory))
        return None

    return write


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first: `step-N` directories that have a manifest."""
    if not run_dir.is_dir():
        return []
    found = []
    for child in run_dir.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and manifest_path(child).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def _fsync_tree(directory: Path) -> None:
    # Data must be on disk before the manifest claims it is complete.
    for dirpath, _dirnames, filenames in os.walk(directory):
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def _prune(run_dir: Path, run: str, keep_last: int, registry: CheckpointRegistry | None) -> tuple[Path, ...]:
    complete = step_dirs(run_dir)
    doomed = complete[: max(len(complete) - keep_last, 0)]
    for step, path in doomed:
        if registry is not None:
            registry.remove(version_id(run, step))
        shutil.rmtree(path)
    return tuple(path for _step, path in doomed)


@dataclass(frozen=True)
class _Plan:
    run_dir: Path
    staging: Path
    final: Path
    run: str
    step: int
    keep_last: int
    registry: CheckpointRegistry | None


def _finalize(plan: _Plan) -> SavedCheckpoint:
    _fsync_tree(plan.staging)
    write_manifest(plan.staging, build_manifest(plan.staging))
    os.replace(plan.staging, plan.final)
    fsync_dir(plan.run_dir)
    entry = plan.registry.register(plan.final, plan.run, plan.step) if plan.registry is not None else None
    pruned = _prune(plan.run_dir, plan.run, plan.keep_last, plan.registry)
    return SavedCheckpoint(plan.final, version_id(plan.run, plan.step), entry, pruned)


def _prepare(root: Path, run: str, step: int, keep_last: int, registry: CheckpointRegistry | None) -> _Plan:
    if keep_last < 1:
        raise ValueError(f"keep_last={keep_last}: must keep at least one checkpoint")
    # Checked before writing anything: a bad run name would only be refused at registration.
    validate_run_step(run, step)
    run_dir = Path(root) / run
    plan = _Plan(
        run_dir, run_dir / f"{STAGING_PREFIX}{step}", run_dir / f"{STEP_PREFIX}{step}", run, step, keep_last, registry
    )
    if plan.final.exists():
        raise FileExistsError(f"{plan.final} already exists")
    # A staging directory left by a crashed save of this step is garbage: start it afresh.
    if plan.staging.exists():
        shutil.rmtree(plan.staging)
    plan.staging.mkdir(parents=True)
    return plan


def save_checkpoint(
    state_dict: Mapping[str, Any],
    root: Path,
    run: str,
    step: int,
    *,
    keep_last: int = 3,
    registry: CheckpointRegistry | None = None,
    writer: Writer | None = None,
) -> Future[SavedCheckpoint]:
    """Save `state_dict` as `<root>/<run>/step-<step>` and return a future of the result.

    With an asynchronous writer the future completes in the background, so the training step
    is not blocked; wait on it (`.result()`) before the next save so saves never overlap.
    """
    write = writer if writer is not None else torch_dcp_writer(state_dict)
    plan = _prepare(root, run, step, keep_last, registry)
    try:
        pending = write(plan.staging)
    except BaseException:
        _discard_staging(plan)
        raise
    if pending is None:
        done: Future[SavedCheckpoint] = Future()
        try:
            done.set_result(_finalize(plan))
        except Exception as exc:  # noqa: BLE001 - delivered to the caller through the future
            done.set_exception(exc)
        return done
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ckpt-{run}-{step}")
    try:
        return executor.submit(_wait_and_finalize, pending, plan)
    finally:
        # The worker thread still runs the submitted job; this only stops it taking more.
        executor.shutdown(wait=False)


def _discard_staging(plan: _Plan) -> None:
    # Partial files of a failed save are useless and can be large; nothing refers to them yet.
    shutil.rmtree(plan.staging, ignore_errors=True)


def _wait_and_finalize(pending: _Pending, plan: _Plan) -> SavedCheckpoint:
    try:
        pending.result()
    except BaseException:
        _discard_staging(plan)
        raise
    return _finalize(plan)
