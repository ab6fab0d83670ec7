"""LoRA adapters for the tiny model, written as PEFT writes them (`adapter_config.json` and
`adapter_model.safetensors`) without peft or torch: the project's environment has neither
requirement, and the vLLM venv is not ours to install into.

The weights are random, not trained: what the release tests need is two adapters whose greedy
answers differ from each other and from the base model, which random B matrices large enough to
move the argmax give. Each adapter is reproducible from its seed.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from array import array
from pathlib import Path

RANK = 8
# Every projection of each layer: q/v alone moved too little of a trained model's output.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _shapes(config: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection, from the base model's config.json."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    q = config["num_attention_heads"] * head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inner),
        "up_proj": (hidden, inner),
        "down_proj": (inner, hidden),
    }


def _module(name: str) -> str:
    return "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"


def write_adapter(directory: Path, base_model: Path, seed: int, scale: float = 1.0) -> None:
    """A rank-8 adapter on every projection of `base_model`; B ~ N(0, scale), A ~ N(0, 1/in)."""
    config = json.loads((base_model / "config.json").read_text())
    rng = random.Random(seed)
    tensors: dict[str, tuple[tuple[int, int], array[float]]] = {}
    for layer in range(config["num_hidden_layers"]):
        for target, (fan_in, fan_out) in _shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.{_module(target)}.{target}"
            a = array("f", (rng.gauss(0.0, fan_in**-0.5) for _ in range(RANK * fan_in)))
            b = array("f", (rng.gauss(0.0, scale) for _ in range(fan_out * RANK)))
            tensors[f"{prefix}.lora_A.weight"] = ((RANK, fan_in), a)
            tensors[f"{prefix}.lora_B.weight"] = ((fan_out, RANK), b)
    directory.mkdir(parents=True, exist_ok=True)
    _write_safetensors(directory / "adapter_model.safetensors", tensors)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model),
        "r": RANK,
        "lora_alpha": RANK,  # scaling alpha/r = 1: `scale` alone sets the size of the change
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGETS),
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))


def _write_safetensors(path: Path, tensors: dict[str, tuple[tuple[int, int], array[float]]]) -> None:
    """The safetensors layout: u64 header length, JSON header (offsets into the data), raw data."""
    header: dict[str, object] = {}
    offset = 0
    for name, (shape, values) in tensors.items():
        size = len(values) * values.itemsize
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for _, values in tensors.values():
            if sys.byteorder != "little":
                values = array("f", values)
                values.byteswap()
            values.tofile(file)
