"""Format detection, manifest contents and where the manifest is written."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from checkpoints.manifest import CheckpointFormat, Manifest, UnknownFormatError, detect_format, manifest_path
from checkpoints.registry import build_manifest, write_manifest
from tests.checkpoints.fixtures import make_dcp, make_gguf, make_lora, make_safetensors


@pytest.mark.parametrize(
    ("make", "name", "expected"),
    [
        (make_dcp, "dcp", CheckpointFormat.DCP),
        (make_safetensors, "hf", CheckpointFormat.SAFETENSORS),
        (make_lora, "lora", CheckpointFormat.LORA),
        (make_gguf, "model.Q4_K_M.gguf", CheckpointFormat.GGUF),
    ],
)
def test_each_layout_is_detected(
    tmp_path: Path, make: Callable[[Path], Path], name: str, expected: CheckpointFormat
) -> None:
    assert detect_format(make(tmp_path / name)) is expected


def test_lora_adapter_with_bin_weights_is_detected(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.bin").write_bytes(b"x")
    assert detect_format(adapter) is CheckpointFormat.LORA


def test_gguf_suffix_without_magic_is_rejected(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"NOPE" + b"\x00" * 8)
    with pytest.raises(UnknownFormatError):
        detect_format(fake)


def test_dcp_metadata_without_shards_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(b"m")
    with pytest.raises(UnknownFormatError):
        detect_format(tmp_path)


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    checkpoint = make_dcp(tmp_path / "ck")
    manifest = build_manifest(checkpoint)
    assert [entry.path for entry in manifest.files] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    shard = manifest.files[1]
    assert shard.size == len(b"shard-zero")
    assert shard.sha256 == hashlib.sha256(b"shard-zero").hexdigest()


def test_nested_files_are_listed_with_posix_relative_paths(tmp_path: Path) -> None:
    checkpoint = make_safetensors(tmp_path / "hf")
    (checkpoint / "tokenizer").mkdir()
    (checkpoint / "tokenizer" / "tokenizer.json").write_text("{}")
    assert "tokenizer/tokenizer.json" in {entry.path for entry in build_manifest(checkpoint).files}


def test_digest_is_sha256_of_canonical_json_without_digest(tmp_path: Path) -> None:
    manifest = build_manifest(make_lora(tmp_path / "lora"))
    payload = manifest.model_dump(mode="json")
    del payload["digest"]
    expected = hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert manifest.digest == f"sha256:{expected}"


def test_directory_manifest_is_written_inside_and_excluded_from_itself(tmp_path: Path) -> None:
    checkpoint = make_dcp(tmp_path / "ck")
    written = write_manifest(checkpoint, build_manifest(checkpoint))
    assert written == checkpoint / "manifest.json"
    assert Manifest.model_validate_json(written.read_bytes()) == build_manifest(checkpoint)
    assert not [p for p in checkpoint.iterdir() if p.name.endswith(".tmp")]


def test_gguf_manifest_is_written_beside_the_file(tmp_path: Path) -> None:
    model = make_gguf(tmp_path / "m.gguf")
    written = write_manifest(model, build_manifest(model))
    assert written == tmp_path / "m.gguf.manifest.json" == manifest_path(model)
    assert [entry.path for entry in build_manifest(model).files] == ["m.gguf"]
