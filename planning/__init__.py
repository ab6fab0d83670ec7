"""Capacity-planning arithmetic behind `gateway plan`: weights, KV cache, concurrency, checkpoints.

Pure functions over frozen dataclasses; `read_config_json` is the only I/O. Bytes are plain
floats (int4 is half a byte per parameter); counts of sequences and tokens are floored ints.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# Mixtral spells it num_local_experts, Qwen-MoE num_experts, DeepSeek n_routed_experts.
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
SECONDS_PER_DAY = 86_400.0


def default_kv_dtype(weight_dtype: str) -> str:
    """The KV cache follows float weights; quantized ones (fp8/int8/int4) still run their
    activations in bf16, and vLLM's kv_cache_dtype=auto then stores the cache in bf16."""
    return weight_dtype if weight_dtype in ("fp32", "bf16", "fp16") else "bf16"


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float) -> float:
    """One K and one V vector per layer per KV head."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


# --- Model shape from a Hugging Face config.json ---------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    params: float | None = None
    active_params: float | None = None  # per token; differs from params only for MoE
    params_estimated: bool = False
    dtype: str | None = None
    max_context: int | None = None
    experts: int | None = None


def read_config_json(path: Path) -> dict[str, Any]:
    """Multimodal configs (Llama 4, Gemma 3, ...) nest the language model under text_config."""
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    text = config.get("text_config")
    if "hidden_size" not in config and isinstance(text, dict):
        return {**config, **text}
    return config


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"config.json has no {key!r}")
        return default
    return int(value)


def _experts(config: Mapping[str, Any]) -> int:
    return next((int(config[k]) for k in _EXPERT_KEYS if config.get(k)), 0)


def estimate_params(config: Mapping[str, Any]) -> tuple[float, float]:
    """(total, active per token) for a Llama-style decoder: gated (SwiGLU) MLP, RMSNorm, no
    biases. Counts to within a fraction of a percent for Llama/Mistral/Qwen; MLA, biases and
    dense-first MoE layers (DeepSeek) are not modelled."""
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim", hidden // heads)
    vocab = _int(config, "vocab_size")
    intermediate = _int(config, "intermediate_size")
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    mlp = 3 * hidden * intermediate  # gate, up, down
    experts = _experts(config)
    shared = 0
    active_mlp = mlp
    if experts:
        expert_mlp = 3 * hidden * _int(config, "moe_intermediate_size", intermediate)
        shared = 3 * hidden * _int(config, "shared_expert_intermediate_size", 0)
        shared += expert_mlp * _int(config, "n_shared_experts", 0)
        router = hidden * experts
        mlp = experts * expert_mlp + shared + router
        active_mlp = _int(config, "num_experts_per_tok", 1) * expert_mlp + shared + router
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    fixed = embeddings + hidden * (2 * layers + 1)  # two norms per layer and a final one
    return float(fixed + layers * (attention + mlp)), float(fixed + layers * (attention + active_mlp))


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size")
    total, active = estimate_params(config)
    context = config.get("max_position_embeddings")
    return ModelShape(
        layers=_int(config, "num_hidden_layers"),
        kv_heads=_int(config, "num_key_value_heads", heads),
        head_dim=_int(config, "head_dim", hidden // heads),
        params=total,
        active_params=active,
        params_estimated=True,
        dtype=_TORCH_DTYPES.get(str(config.get("torch_dtype", ""))),
        max_context=int(context) if context else None,
        experts=_experts(config) or None,
    )


# --- Serving ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingInputs:
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    kv_dtype: str
    gpu_mem: float  # bytes per GPU
    gpus: int  # tensor-parallel degree of one deployment
    context: int
    prompt_tokens: int
    output_tokens: int
    gpu_util: float = 0.9
    overhead: float = 2 * 2**30  # bytes per GPU
    margin: float = 0.9


@dataclass(frozen=True)
class ServingPlan:
    weights_total: float
    weights_per_gpu: float
    budget_per_gpu: float  # gpu_mem x gpu_util: what vLLM lets itself use
    kv_per_token: float  # whole model
    kv_heads_per_gpu: int
    kv_per_token_per_gpu: float
    expected_tokens: int
    kv_per_seq_expected: float
    kv_per_seq_context: float
    kv_available_per_gpu: float
    kv_available_total: float
    kv_token_capacity: int
    max_seqs_expected: int
    max_seqs_context: int
    max_inflight: int
    problem: str | None  # why this deployment cannot start; None when it can


def _serving_problem(inp: ServingInputs, weights_per_gpu: float, kv_free: float, capacity: int) -> str | None:
    gib = 2**30
    budget = inp.gpu_mem * inp.gpu_util
    where = f"the {budget / gib:.1f} GiB per GPU that gpu_memory_utilization={inp.gpu_util:g} allows"
    remedy = "use more GPUs (--gpus), a smaller --dtype, or larger GPUs"
    if weights_per_gpu >= budget:
        return f"the weights do not fit: {weights_per_gpu / gib:.1f} GiB per GPU exceed {where}; {remedy}"
    if weights_per_gpu + inp.overhead >= budget:
        return (
            f"no room for the KV cache: {weights_per_gpu / gib:.1f} GiB per GPU of weights plus "
            f"{inp.overhead / gib:.1f} GiB overhead fill {where}; {remedy}"
        )
    if capacity < inp.context:
        # vLLM checks this at start-up and refuses to run.
        return (
            f"the KV cache holds {capacity:,} tokens ({kv_free / gib:.1f} GiB per GPU), fewer than one "
            f"sequence at --context {inp.context:,}; lower --context, use --kv-dtype fp8, or add GPUs"
        )
    return None


def plan_serving(inp: ServingInputs) -> ServingPlan:
    """One vLLM-style deployment with tensor parallelism over `gpus`: weights split evenly,
    KV heads split too but never below one per GPU (vLLM replicates them when kv_heads < tp)."""
    weights_total = inp.params * DTYPE_BYTES[inp.dtype]
    weights_per_gpu = weights_total / inp.gpus
    kv_bytes = DTYPE_BYTES[inp.kv_dtype]
    heads_per_gpu = max(1, math.ceil(inp.kv_heads / inp.gpus))
    per_token_gpu = kv_bytes_per_token(inp.layers, heads_per_gpu, inp.head_dim, kv_bytes)
    kv_free = max(0.0, inp.gpu_mem * inp.gpu_util - weights_per_gpu - inp.overhead)
    # Every GPU holds its share of every token, so one GPU's room is the deployment's capacity.
    capacity = math.floor(kv_free / per_token_gpu)
    expected = inp.prompt_tokens + inp.output_tokens
    fits_expected = capacity // expected
    return ServingPlan(
        weights_total=weights_total,
        weights_per_gpu=weights_per_gpu,
        budget_per_gpu=inp.gpu_mem * inp.gpu_util,
        kv_per_token=kv_bytes_per_token(inp.layers, inp.kv_heads, inp.head_dim, kv_bytes),
        kv_heads_per_gpu=heads_per_gpu,
        kv_per_token_per_gpu=per_token_gpu,
        expected_tokens=expected,
        kv_per_seq_expected=per_token_gpu * inp.gpus * expected,
        kv_per_seq_context=per_token_gpu * inp.gpus * inp.context,
        kv_available_per_gpu=kv_free,
        kv_available_total=kv_free * inp.gpus,
        kv_token_capacity=capacity,
        max_seqs_expected=fits_expected,
        max_seqs_context=capacity // inp.context,
        # The margin absorbs block rounding (vLLM allocates 16-token blocks) and longer-than-
        # expected requests; the floor of 1 keeps a tiny deployment usable.
        max_inflight=max(1, math.floor(fits_expected * inp.margin)),
        problem=_serving_problem(inp, weights_per_gpu, kv_free, capacity),
    )


# --- Training: checkpoint size, failures, checkpoint interval ---------------------------------


@dataclass(frozen=True)
class StateComponent:
    name: str
    bytes_per_param: float
    needed_to_resume: bool  # False for what a restart can rebuild (half copies, gradients)


_MASTER = StateComponent("fp32 master weights", 4, True)
_HALF = (StateComponent("bf16 weights (compute copy)", 2, False), StateComponent("bf16 gradients", 2, False))
_FP32_GRADS = StateComponent("fp32 gradients", 4, False)
_OPTIMIZER_STATE = {
    "adam": (
        StateComponent("Adam first moment m (fp32)", 4, True),
        StateComponent("Adam second moment v (fp32)", 4, True),
    ),
    "sgd": (StateComponent("SGD momentum buffer (fp32)", 4, True),),
}
OPTIMIZERS = tuple(_OPTIMIZER_STATE)
PRECISIONS = ("mixed", "fp32")


def training_state(optimizer: str, precision: str) -> tuple[StateComponent, ...]:
    """Bytes per parameter of the training state: mixed precision keeps fp32 master weights
    beside bf16 compute weights and gradients (ZeRO's 2 + 2 + K); fp32 keeps one copy."""
    extra = _HALF if precision == "mixed" else (_FP32_GRADS,)
    return (_MASTER, *_OPTIMIZER_STATE[optimizer], *extra)


@dataclass(frozen=True)
class CheckpointSizes:
    optimizer: str
    precision: str
    components: tuple[StateComponent, ...]
    full_bytes_per_param: float  # everything in training_state
    resume_bytes_per_param: float  # without the half copies and gradients a restart rebuilds
    weights_bytes_per_param: float  # the weights alone, as an inference export
    full_bytes: float
    resume_bytes: float
    weights_bytes: float


def checkpoint_sizes(params: float, optimizer: str, precision: str) -> CheckpointSizes:
    components = training_state(optimizer, precision)
    full = sum(c.bytes_per_param for c in components)
    resume = sum(c.bytes_per_param for c in components if c.needed_to_resume)
    weights = DTYPE_BYTES["bf16" if precision == "mixed" else "fp32"]
    return CheckpointSizes(
        optimizer, precision, components, full, resume, weights, params * full, params * resume, params * weights
    )


def failure_probability_per_day(gpus: int, afr: float) -> float:
    """At least one of `gpus` fails today, each independently with probability AFR/365."""
    return 1 - (1 - afr / 365) ** gpus


def cluster_mtbf_s(gpus: int, afr: float) -> float:
    """Failures arrive at gpus x AFR per year, so the mean time between them is the inverse."""
    return 365 * SECONDS_PER_DAY / (gpus * afr)


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * write_s * mtbf_s)


def daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly (2006), first-order refinement of Young; past C >= 2M it prescribes M itself."""
    if write_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = write_s / (2 * mtbf_s)
    return young_interval_s(write_s, mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - write_s


def time_lost_fraction(write_s: float, interval_s: float, mtbf_s: float) -> float:
    """Writing (C/tau) plus redoing half an interval per failure (tau/2M); capped at 1 because
    the first-order approximation overshoots once checkpoints cannot keep up."""
    return min(1.0, write_s / interval_s + interval_s / (2 * mtbf_s))


@dataclass(frozen=True)
class CheckpointInterval:
    write_s: float
    mtbf_s: float
    young_s: float
    daly_s: float
    lost_at_young: float
    lost_at_daly: float


def checkpoint_interval(write_s: float, mtbf_s: float) -> CheckpointInterval:
    young = young_interval_s(write_s, mtbf_s)
    daly = daly_interval_s(write_s, mtbf_s)
    return CheckpointInterval(
        write_s,
        mtbf_s,
        young,
        daly,
        time_lost_fraction(write_s, young, mtbf_s),
        time_lost_fraction(write_s, daly, mtbf_s),
    )


# --- Units on the command line ------------------------------------------------------------

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_SIZE = re.compile(rf"^{_NUMBER}\s*([kmgtp]?)(i?)(b)$", re.IGNORECASE)
_DURATION = re.compile(rf"^{_NUMBER}\s*(ms|s|min|m|h|d)?$")
_COUNT = re.compile(rf"^{_NUMBER}\s*([kmbt]?)$", re.IGNORECASE)
_PREFIX_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_DURATION_S = {"ms": 0.001, "s": 1, "min": 60, "m": 60, "h": 3600, "d": 86400}
_COUNT_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> float:
    """`80GiB` (binary) or `80GB` (decimal) to bytes. A unit is required, and a lower-case `b`
    is refused because `5Gb` usually means gigabits, eight times less than it would read as."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r}: expected a size such as 80GiB, 80GB or 512MiB")
    number, prefix, binary, unit = match.groups()
    if unit == "b":
        raise ValueError(f"{text!r}: b is bits; write bytes with B, e.g. 5GB")
    if binary and not prefix:
        raise ValueError(f"{text!r}: expected a size such as 80GiB, 80GB or 512MiB")
    base = 1024 if binary else 1000
    return float(number) * float(base) ** _PREFIX_POWER[prefix.lower()]


def parse_bandwidth(text: str) -> float:
    """`5GB/s` to bytes per second."""
    body = text.strip()
    if not body.endswith("/s"):
        raise ValueError(f"{text!r}: expected a rate such as 5GB/s")
    return parse_size(body[:-2])


def parse_duration(text: str) -> float:
    """`60s`, `30min`, `4h`, `2d` to seconds; a bare number is seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r}: expected a duration such as 60s, 30min, 4h or 2d")
    return float(match.group(1)) * _DURATION_S[match.group(2) or "s"]


def parse_count(text: str) -> float:
    """`70e9`, `70B`, `8.03b`, `1.5T` parameters."""
    match = _COUNT.match(text.strip())
    if not match:
        raise ValueError(f"{text!r}: expected a count such as 70e9 or 70B")
    return float(match.group(1)) * _COUNT_SCALE[match.group(2).lower()]
