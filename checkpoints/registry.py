"""Versioned training checkpoints: verification against manifests and a file-backed registry.

A version id is `<run>@<step>`. The registry is one JSON file under a root directory, rewritten
atomically under an fcntl lock so concurrent `register` calls from several processes serialize.
"""

from __future__ import annotations

import fcntl
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict

from checkpoints.manifest import (
    CheckpointFormat,
    Manifest,
    UnsafeFileError,
    atomic_write_bytes,
    base_dir,
    build_manifest,
    content_files,
    hash_regular,
    is_single_file,
    manifest_path,
    read_manifest,
    write_manifest,
)

__all__ = [
    "CheckpointRegistry",
    "LatestValid",
    "Problem",
    "ProblemKind",
    "RegistryEntry",
    "RegistryError",
    "VerifyReport",
    "build_manifest",
    "validate_run_step",
    "verify",
    "version_id",
    "write_manifest",
]

DEFAULT_ROOT = Path("checkpoints-registry")
REGISTRY_NAME = "registry.json"
LOCK_NAME = "registry.lock"
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ProblemKind(StrEnum):
    MISSING = "missing"
    TRUNCATED = "truncated"
    GROWN = "grown"
    CHANGED = "changed"
    UNEXPECTED = "unexpected"
    NO_MANIFEST = "no-manifest"
    INVALID_MANIFEST = "invalid-manifest"
    DIGEST_MISMATCH = "digest-mismatch"
    UNSAFE = "unsafe"  # not a regular file inside the checkpoint: never read


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    file: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.file}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class VerifyReport:
    path: Path
    problems: tuple[Problem, ...]
    manifest: Manifest | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_files(checkpoint: Path, manifest: Manifest) -> Iterator[Problem]:
    root = base_dir(checkpoint)
    for entry in manifest.files:
        if is_single_file(checkpoint) and entry.path != checkpoint.name:
            # A GGUF manifest sits beside its file: it may name that file and nothing else there.
            yield Problem(ProblemKind.UNSAFE, entry.path, f"a GGUF manifest may name only {checkpoint.name}")
            continue
        try:
            size, sha256 = hash_regular(root, entry.path)
        except FileNotFoundError:
            yield Problem(ProblemKind.MISSING, entry.path)
            continue
        except UnsafeFileError as error:
            yield Problem(ProblemKind.UNSAFE, entry.path, str(error).removeprefix(f"{entry.path}: "))
            continue
        if size != entry.size:
            kind = ProblemKind.TRUNCATED if size < entry.size else ProblemKind.GROWN
            yield Problem(kind, entry.path, f"{size} bytes, manifest says {entry.size}")
        elif sha256 != entry.sha256:
            yield Problem(ProblemKind.CHANGED, entry.path, "sha256 differs from manifest")
    listed = {entry.path for entry in manifest.files}
    for rel in content_files(checkpoint):
        if rel not in listed:
            yield Problem(ProblemKind.UNEXPECTED, rel, "not in manifest")


def verify(checkpoint: Path, expected_digest: str | None = None) -> VerifyReport:
    """Recompute everything and report every problem, not only the first one found.

    `expected_digest` (the digest the registry recorded) catches a manifest that was rewritten
    consistently, digest included, after registration.
    """
    checkpoint = Path(checkpoint)
    mpath = manifest_path(checkpoint)
    try:
        manifest = read_manifest(checkpoint)
    except FileNotFoundError:
        return VerifyReport(checkpoint, (Problem(ProblemKind.NO_MANIFEST, mpath.name, "checkpoint incomplete"),))
    except ValueError as exc:
        detail = str(exc).splitlines()[0]
        return VerifyReport(checkpoint, (Problem(ProblemKind.INVALID_MANIFEST, mpath.name, detail),))
    problems: list[Problem] = []
    actual = manifest.compute_digest()
    if manifest.digest != actual:
        problems.append(Problem(ProblemKind.DIGEST_MISMATCH, mpath.name, "manifest content does not match its digest"))
    elif expected_digest is not None and manifest.digest != expected_digest:
        problems.append(Problem(ProblemKind.DIGEST_MISMATCH, mpath.name, f"registry recorded {expected_digest}"))
    problems.extend(_check_files(checkpoint, manifest))
    return VerifyReport(checkpoint, tuple(problems), manifest)


class RegistryError(Exception):
    """A register/get request the registry refuses; the message says why."""


class RegistryEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    run: str
    step: int
    path: str
    format: CheckpointFormat
    registered_at: datetime
    manifest_digest: str


class _RegistryFile(BaseModel):
    versions: dict[str, RegistryEntry] = {}


def version_id(run: str, step: int) -> str:
    return f"{run}@{step}"


def validate_run_step(run: str, step: int) -> None:
    """Raise RegistryError unless `<run>@<step>` is an unambiguous version id and a safe directory name."""
    if not _RUN_NAME.match(run):
        raise RegistryError(f"run {run!r}: use letters, digits, '.', '_' or '-' (no '@' or '/')")
    if step < 0:
        raise RegistryError(f"step {step}: must be >= 0")


@dataclass(frozen=True)
class LatestValid:
    entry: RegistryEntry | None
    # Newer versions passed over, each with the report saying what is wrong with it.
    skipped: tuple[tuple[RegistryEntry, VerifyReport], ...] = field(default=())


class CheckpointRegistry:
    def __init__(self, root: Path = DEFAULT_ROOT, clock: Callable[[], datetime] | None = None) -> None:
        self.root = Path(root)
        self._clock = clock or (lambda: datetime.now(UTC))

    @property
    def _file(self) -> Path:
        return self.root / REGISTRY_NAME

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # A separate lock file: the registry file itself is replaced on every write, so a lock
        # held on it would guard an inode nobody else opens any more.
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / LOCK_NAME).open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _load(self) -> _RegistryFile:
        try:
            return _RegistryFile.model_validate_json(self._file.read_bytes())
        except FileNotFoundError:
            return _RegistryFile()

    def _save(self, data: _RegistryFile) -> None:
        payload = orjson.dumps(data.model_dump(mode="json"), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        atomic_write_bytes(self._file, payload + b"\n")

    def register(self, path: Path, run: str, step: int) -> RegistryEntry:
        """Record `path` as `<run>@<step>`, writing its manifest first if it has none.

        An existing manifest must verify: registering would otherwise bless tampered files.
        """
        validate_run_step(run, step)
        path = Path(path).absolute()
        if not manifest_path(path).exists():
            try:
                write_manifest(path, build_manifest(path))
            except UnsafeFileError as error:
                raise RegistryError(f"{path}: {error}") from None
        report = verify(path)
        if not report.ok or report.manifest is None:
            raise RegistryError(f"{path}: " + "; ".join(str(problem) for problem in report.problems))
        version = version_id(run, step)
        entry = RegistryEntry(
            version=version,
            run=run,
            step=step,
            path=str(path),
            format=report.manifest.format,
            registered_at=self._clock(),
            manifest_digest=report.manifest.digest,
        )
        with self._locked():
            data = self._load()
            if version in data.versions:
                raise RegistryError(f"{version} is already registered at {data.versions[version].path}")
            data.versions[version] = entry
            self._save(data)
        return entry

    def remove(self, version: str) -> None:
        with self._locked():
            data = self._load()
            if data.versions.pop(version, None) is not None:
                self._save(data)

    def get(self, version: str) -> RegistryEntry:
        entry = self._load().versions.get(version)
        if entry is None:
            raise RegistryError(f"unknown version {version!r}")
        return entry

    def list(self, run: str | None = None) -> list[RegistryEntry]:
        entries = [entry for entry in self._load().versions.values() if run is None or entry.run == run]
        return sorted(entries, key=lambda entry: (entry.run, entry.step, entry.registered_at))

    def verify(self, version: str) -> VerifyReport:
        entry = self.get(version)
        return verify(Path(entry.path), expected_digest=entry.manifest_digest)

    def latest_valid(self, run: str | None = None) -> LatestValid:
        """The newest version (by step, then registration time) whose files match its manifest."""
        newest_first = sorted(self.list(run), key=lambda entry: (entry.step, entry.registered_at), reverse=True)
        skipped: list[tuple[RegistryEntry, VerifyReport]] = []
        for entry in newest_first:
            report = verify(Path(entry.path), expected_digest=entry.manifest_digest)
            if report.ok:
                return LatestValid(entry, tuple(skipped))
            skipped.append((entry, report))
        return LatestValid(None, tuple(skipped))
