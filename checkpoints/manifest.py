"""Checkpoint manifests: format detection, per-file SHA-256, a self-digest, atomic writes.

A manifest is the completion marker of a checkpoint: it is written last, so a checkpoint
whose manifest is absent is by definition incomplete (a crash mid-save, a partial copy).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated, BinaryIO

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MANIFEST_NAME = "manifest.json"
GGUF_MANIFEST_SUFFIX = ".manifest.json"
GGUF_MAGIC = b"GGUF"
# Large shards are hashed in fixed blocks so memory use does not grow with checkpoint size.
BLOCK_SIZE = 1 << 20
SCHEMA_VERSION = 1


class CheckpointFormat(StrEnum):
    DCP = "torch-dcp"
    SAFETENSORS = "hf-safetensors"
    LORA = "lora-adapter"
    GGUF = "gguf"


class UnknownFormatError(ValueError):
    """The path is not a checkpoint layout we recognise."""


class UnsafeFileError(ValueError):
    """A checkpoint file that is not a regular file inside the checkpoint (a device, a FIFO, a link
    leading out): reading it could hang (/dev/zero, a FIFO) or reveal files the checkpoint does not own."""


def _inside(path: str) -> str:
    parts = PurePosixPath(path).parts
    if not path or path.startswith("/") or "\\" in path or any(part in ("..", ".") for part in path.split("/")):
        raise ValueError(f"{path!r}: a manifest path must be a relative path inside the checkpoint")
    if not parts:
        raise ValueError("a manifest path must not be empty")
    return path


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Annotated[str, AfterValidator(_inside)]  # relative to the checkpoint directory, POSIX separators
    size: int = Field(ge=0)
    sha256: str


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    format: CheckpointFormat
    files: tuple[FileEntry, ...]
    digest: str = ""

    def canonical_bytes(self) -> bytes:
        """The bytes the digest covers: sorted-key JSON of everything except the digest itself."""
        payload = self.model_dump(mode="json", exclude={"digest"})
        return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)

    def compute_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_bytes()).hexdigest()

    def sealed(self) -> Manifest:
        return self.model_copy(update={"digest": self.compute_digest()})


def is_single_file(checkpoint: Path) -> bool:
    # Decided by name, not by stat, so a deleted GGUF file still maps to its manifest.
    return checkpoint.suffix == ".gguf" and not checkpoint.is_dir()


def manifest_path(checkpoint: Path) -> Path:
    """Where the manifest of `checkpoint` lives: inside a directory, beside a single GGUF file."""
    if is_single_file(checkpoint):
        return checkpoint.with_name(checkpoint.name + GGUF_MANIFEST_SUFFIX)
    return checkpoint / MANIFEST_NAME


def base_dir(checkpoint: Path) -> Path:
    """The directory manifest paths are relative to."""
    return checkpoint.parent if is_single_file(checkpoint) else checkpoint


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(BLOCK_SIZE):
            digest.update(block)
    return digest.hexdigest()


def open_regular(root: Path, rel: str) -> tuple[BinaryIO, int]:
    """Open `root/rel` for reading, with its size, only if it is a regular file that resolves
    inside `root`. Raises UnsafeFileError, or FileNotFoundError when it is absent."""
    path = root / rel
    if not path.resolve().is_relative_to(root.resolve()):
        raise UnsafeFileError(f"{rel}: leads outside the checkpoint")
    # O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked on the open file,
    # so swapping the path for a device after a check cannot slip through.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{rel}: not a regular file")
    return os.fdopen(fd, "rb"), info.st_size


def hash_regular(root: Path, rel: str) -> tuple[int, str]:
    """(size, sha256) of a regular file inside `root`, reading no more than the size it had when
    opened (a file that grows meanwhile is hashed as it was, and then fails verification)."""
    handle, size = open_regular(root, rel)
    digest = hashlib.sha256()
    left = size
    with handle:
        while left > 0 and (block := handle.read(min(BLOCK_SIZE, left))):
            digest.update(block)
            left -= len(block)
    return size, digest.hexdigest()


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def detect_format(checkpoint: Path) -> CheckpointFormat:
    if checkpoint.is_file():
        if checkpoint.suffix == ".gguf" and _is_gguf(checkpoint):
            return CheckpointFormat.GGUF
        raise UnknownFormatError(f"{checkpoint}: a single file must be a .gguf starting with the GGUF magic")
    if not checkpoint.is_dir():
        raise UnknownFormatError(f"{checkpoint}: no such file or directory")
    names = {entry.name for entry in checkpoint.iterdir() if entry.is_file()}
    if ".metadata" in names and any(name.endswith(".distcp") for name in names):
        return CheckpointFormat.DCP
    # Checked before plain safetensors: an adapter directory also holds a .safetensors file.
    if "adapter_config.json" in names and names & {"adapter_model.safetensors", "adapter_model.bin"}:
        return CheckpointFormat.LORA
    if any(name.endswith(".safetensors") for name in names):
        return CheckpointFormat.SAFETENSORS
    raise UnknownFormatError(
        f"{checkpoint}: not a DCP (.metadata + *.distcp), safetensors, LoRA adapter or GGUF checkpoint"
    )


def content_files(checkpoint: Path) -> list[str]:
    """Every file that belongs to the checkpoint, relative and sorted; the manifest is not one."""
    if is_single_file(checkpoint):
        return [checkpoint.name] if checkpoint.is_file() else []
    found: list[str] = []
    for dirpath, _dirnames, filenames in os.walk(checkpoint):
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(checkpoint).as_posix()
            if rel != MANIFEST_NAME:
                found.append(rel)
    return sorted(found)


def build_manifest(checkpoint: Path) -> Manifest:
    fmt = detect_format(checkpoint)
    root = base_dir(checkpoint)
    entries = []
    for rel in content_files(checkpoint):
        size, sha256 = hash_regular(root, rel)
        entries.append(FileEntry(path=rel, size=size, sha256=sha256))
    return Manifest(format=fmt, files=tuple(entries)).sealed()


def fsync_dir(directory: Path) -> None:
    """Make a rename or create inside `directory` durable, not only the file contents."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Readers see the old file or the whole new one, never a torn write, even across a crash."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def write_manifest(checkpoint: Path, manifest: Manifest) -> Path:
    target = manifest_path(checkpoint)
    data = orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    atomic_write_bytes(target, data + b"\n")
    return target


def read_manifest(checkpoint: Path) -> Manifest:
    """Raises FileNotFoundError when absent, ValueError when it does not parse as a manifest."""
    return Manifest.model_validate_json(manifest_path(checkpoint).read_bytes())
