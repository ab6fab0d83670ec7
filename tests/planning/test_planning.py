"""The capacity-planning formulas against published figures and worked examples by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import planning
from planning import ServingInputs

GIB = 2**30

LLAMA_3_8B: dict[str, Any] = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def llama_70b(**overrides: Any) -> ServingInputs:
    """Llama-2/3-70B's attention shape with a round 70e9 parameters, so the arithmetic can be
    done by hand: 140e9 bytes of bf16 weights."""
    fields: dict[str, Any] = {
        "params": 70e9,
        "layers": 80,
        "kv_heads": 8,
        "head_dim": 128,
        "dtype": "bf16",
        "kv_dtype": "bf16",
        "gpu_mem": 80 * GIB,
        "gpus": 4,
        "context": 8192,
        "prompt_tokens": 2048,
        "output_tokens": 512,
    }
    return ServingInputs(**(fields | overrides))


# --- Published figures -----------------------------------------------------------------------


def test_llama_2_70b_kv_cache_is_320_kib_per_token_in_bf16() -> None:
    per_token = planning.kv_bytes_per_token(layers=80, kv_heads=8, head_dim=128, dtype_bytes=2)
    assert per_token == 2 * 80 * 8 * 128 * 2 == 327_680 == 320 * 1024


def test_llama_3_8b_kv_cache_is_128_kib_per_token_in_bf16() -> None:
    assert planning.kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2) == 128 * 1024


def test_70b_parameters_in_bf16_are_140_gb_of_weights() -> None:
    plan = planning.plan_serving(llama_70b())
    assert plan.weights_total == 140e9
    assert plan.weights_per_gpu == 35e9


def test_int4_weights_take_half_a_byte_per_parameter() -> None:
    assert planning.plan_serving(llama_70b(dtype="int4")).weights_total == 35e9


def test_adam_in_mixed_precision_is_16_bytes_per_parameter_so_1_12_tb_for_70b() -> None:
    sizes = planning.checkpoint_sizes(70e9, "adam", "mixed")
    assert [c.bytes_per_param for c in sizes.components] == [4, 4, 4, 2, 2]
    assert sizes.full_bytes_per_param == 16
    assert sizes.full_bytes == pytest.approx(1.12e12)
    assert sizes.resume_bytes_per_param == 12  # without the bf16 copies of weights and gradients
    assert sizes.resume_bytes == pytest.approx(840e9)
    assert sizes.weights_bytes == pytest.approx(140e9)


@pytest.mark.parametrize(
    ("optimizer", "precision", "full", "resume", "weights"),
    [("adam", "fp32", 16, 12, 4), ("sgd", "mixed", 12, 8, 2), ("sgd", "fp32", 12, 8, 4)],
)
def test_bytes_per_parameter_table(optimizer: str, precision: str, full: int, resume: int, weights: int) -> None:
    sizes = planning.checkpoint_sizes(1.0, optimizer, precision)
    assert (sizes.full_bytes_per_param, sizes.resume_bytes_per_param, sizes.weights_bytes_per_param) == (
        full,
        resume,
        weights,
    )


def test_16000_gpus_at_2_percent_afr_fail_at_least_once_a_day_58_percent_of_the_time() -> None:
    p = planning.failure_probability_per_day(16_000, 0.02)
    assert p == pytest.approx(1 - (1 - 0.02 / 365) ** 16_000)
    assert p == pytest.approx(0.584, abs=0.001)


def test_16000_gpus_at_2_percent_afr_fail_every_27_hours_on_average() -> None:
    # 16,000 x 0.02 = 320 failures a year.
    assert planning.cluster_mtbf_s(16_000, 0.02) == pytest.approx(365 * 86400 / 320)
    assert planning.cluster_mtbf_s(16_000, 0.02) / 3600 == pytest.approx(27.375)


def test_young_interval_for_a_60_s_write_and_4_h_mtbf_is_about_1315_s() -> None:
    young = planning.young_interval_s(60, 4 * 3600)
    assert young == pytest.approx(math.sqrt(2 * 60 * 14_400))
    assert round(young) == 1315


def test_daly_interval_refines_young_by_the_published_series() -> None:
    c, m = 60.0, 14_400.0
    ratio = c / (2 * m)
    expected = math.sqrt(2 * c * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - c
    assert planning.daly_interval_s(c, m) == pytest.approx(expected)
    assert planning.daly_interval_s(c, m) == pytest.approx(1274.8, abs=0.1)


def test_daly_interval_is_the_mtbf_once_writes_take_twice_the_mtbf() -> None:
    assert planning.daly_interval_s(9000, 4000) == 4000


def test_time_lost_at_young_interval_is_twice_sqrt_c_over_2m() -> None:
    interval = planning.checkpoint_interval(60, 14_400)
    assert interval.lost_at_young == pytest.approx(2 * math.sqrt(60 / (2 * 14_400)))
    assert interval.lost_at_young == pytest.approx(0.0913, abs=1e-4)


def test_time_lost_is_capped_at_everything() -> None:
    assert planning.time_lost_fraction(write_s=100, interval_s=10, mtbf_s=5) == 1.0


# --- Parameter estimates from config.json -----------------------------------------------------


def test_llama_3_8b_config_estimates_8_billion_parameters(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_3_8B))
    shape = planning.shape_from_config(planning.read_config_json(path))
    assert shape.params == pytest.approx(8.03e9, rel=0.02)
    assert shape.params_estimated
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (32, 8, 128)
    assert (shape.dtype, shape.max_context) == ("bf16", 8192)
    assert shape.active_params == shape.params
    assert shape.experts is None


def test_tied_embeddings_are_counted_once() -> None:
    # Llama-3.2-1B: published as 1.24B parameters.
    config = {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    }
    total, _ = planning.estimate_params(config)
    assert total == pytest.approx(1.24e9, rel=0.01)


def test_mixture_of_experts_counts_every_expert_and_the_active_ones_per_token() -> None:
    # Mixtral-8x7B: published as 46.7B parameters, 12.9B active per token.
    config = LLAMA_3_8B | {"vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
    total, active = planning.estimate_params(config)
    assert total == pytest.approx(46.7e9, rel=0.01)
    assert active == pytest.approx(12.9e9, rel=0.01)
    assert planning.shape_from_config(config).experts == 8


def test_missing_kv_heads_and_head_dim_default_to_attention_heads_and_hidden_over_heads() -> None:
    config = {k: v for k, v in LLAMA_3_8B.items() if k != "num_key_value_heads"}
    shape = planning.shape_from_config(config)
    assert (shape.kv_heads, shape.head_dim) == (32, 128)


def test_a_multimodal_config_is_read_from_its_text_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llava", "text_config": LLAMA_3_8B}))
    assert planning.shape_from_config(planning.read_config_json(path)).layers == 32


def test_a_config_without_the_architecture_is_refused() -> None:
    with pytest.raises(ValueError, match="num_hidden_layers"):
        planning.estimate_params({"hidden_size": 4096, "num_attention_heads": 32})


# --- Serving: a worked example and the edges ----------------------------------------------------


def test_concurrent_sequences_for_70b_on_four_80_gib_gpus_by_hand() -> None:
    plan = planning.plan_serving(llama_70b())
    # Per GPU: 80 GiB x 0.9 = 77,309,411,328 B, less 2 GiB overhead = 75,161,927,680 B,
    # less 35e9 B of weights = 40,161,927,680 B for the KV cache.
    assert plan.kv_available_per_gpu == pytest.approx(40_161_927_680)
    # Each GPU holds 2 of the 8 KV heads: 2 x 80 x 2 x 128 x 2 = 81,920 B per token.
    assert plan.kv_per_token_per_gpu == 81_920
    assert plan.kv_token_capacity == 490_257  # 40,161,927,680 / 81,920 = 490,257.9
    assert plan.max_seqs_expected == 191  # 490,257 / (2,048 + 512) = 191.5
    assert plan.max_seqs_context == 59  # 490,257 / 8,192 = 59.8
    assert plan.max_inflight == 171  # 90% of 191 = 171.9
    assert plan.kv_per_seq_expected == 327_680 * 2560
    assert plan.problem is None


def test_kv_heads_are_replicated_when_gpus_outnumber_them() -> None:
    plan = planning.plan_serving(llama_70b(gpus=16))
    assert plan.kv_heads_per_gpu == 1
    assert plan.kv_per_token_per_gpu == 2 * 80 * 1 * 128 * 2


def test_weights_larger_than_the_budget_are_reported_as_not_fitting() -> None:
    plan = planning.plan_serving(llama_70b(gpus=1))
    assert plan.problem is not None
    assert plan.problem.startswith("the weights do not fit")
    assert plan.kv_token_capacity == 0


def test_weights_that_leave_no_room_for_the_overhead_are_reported() -> None:
    # 70 GB of weights per GPU fit the 72 GB budget, but not with 2 GiB more.
    plan = planning.plan_serving(llama_70b(gpus=2, gpu_mem=80e9))
    assert plan.problem is not None
    assert plan.problem.startswith("no room for the KV cache")


def test_a_kv_cache_smaller_than_one_full_context_is_reported() -> None:
    # 40 GB per GPU of KV cache holds ~490k tokens; a 1M-token context does not fit once.
    plan = planning.plan_serving(llama_70b(context=1_000_000))
    assert plan.problem is not None
    assert "fewer than one sequence" in plan.problem


def test_max_inflight_is_at_least_one() -> None:
    # Room for exactly one full-length sequence: the 90% margin would round it to zero.
    plan = planning.plan_serving(llama_70b(context=400_000, prompt_tokens=300_000, output_tokens=100_000))
    assert plan.max_seqs_expected == 1
    assert plan.max_inflight == 1


def test_fp8_kv_cache_doubles_the_capacity() -> None:
    bf16 = planning.plan_serving(llama_70b())
    fp8 = planning.plan_serving(llama_70b(kv_dtype="fp8"))
    assert fp8.kv_token_capacity // 2 == bf16.kv_token_capacity


@pytest.mark.parametrize(
    ("weights", "kv"), [("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32"), ("fp8", "bf16"), ("int4", "bf16")]
)
def test_kv_cache_follows_float_weights_and_stays_bf16_under_quantized_ones(weights: str, kv: str) -> None:
    assert planning.default_kv_dtype(weights) == kv


# --- Units -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (planning.parse_size, "80GiB", 80 * GIB),
        (planning.parse_size, "80GB", 80e9),
        (planning.parse_size, "80 GiB", 80 * GIB),
        (planning.parse_size, "512MiB", 512 * 2**20),
        (planning.parse_size, "1.5TB", 1.5e12),
        (planning.parse_bandwidth, "5GB/s", 5e9),
        (planning.parse_duration, "60s", 60),
        (planning.parse_duration, "60", 60),
        (planning.parse_duration, "30min", 1800),
        (planning.parse_duration, "4h", 14_400),
        (planning.parse_duration, "2d", 172_800),
        (planning.parse_count, "70e9", 70e9),
        (planning.parse_count, "70B", 70e9),
        (planning.parse_count, "8.03b", 8.03e9),
    ],
)
def test_units_parse(parse: Any, text: str, value: float) -> None:
    assert parse(text) == pytest.approx(value)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (planning.parse_size, "80", "expected a size"),
        (planning.parse_size, "80Gb", "bits"),
        (planning.parse_size, "80iB", "expected a size"),
        (planning.parse_bandwidth, "5GB", "expected a rate"),
        (planning.parse_duration, "4 hours", "expected a duration"),
        (planning.parse_count, "seventy", "expected a count"),
    ],
)
def test_malformed_units_are_refused_with_an_example(parse: Any, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(text)
