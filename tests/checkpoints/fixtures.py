"""Tiny on-disk checkpoints of each supported layout, for tests."""

from __future__ import annotations

from pathlib import Path


def make_dcp(directory: Path, payload: bytes = b"shard-zero") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".metadata").write_bytes(b"dcp-metadata")
    (directory / "__0_0.distcp").write_bytes(payload)
    (directory / "__1_0.distcp").write_bytes(b"shard-one" * 100)
    return directory


def make_safetensors(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model-00001-of-00002.safetensors").write_bytes(b"a" * 64)
    (directory / "model-00002-of-00002.safetensors").write_bytes(b"b" * 64)
    (directory / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (directory / "config.json").write_text('{"model_type": "llama"}')
    return directory


def make_lora(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text('{"r": 8}')
    (directory / "adapter_model.safetensors").write_bytes(b"lora" * 16)
    return directory


def make_gguf(file: Path) -> Path:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 56)
    return file
