"""`gateway plan` end to end: the report, --json, exit codes and the parsing of units."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gateway.cli.plan import plan_command

LLAMA_3_70B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
SHAPE_70B = ["--params", "70e9", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--context", "8192"]


def plan(*args: str) -> Result:
    return CliRunner().invoke(plan_command, list(args))


def plan_json(*args: str) -> dict[str, Any]:
    result = plan(*args, "--json")
    assert result.exit_code == 0, result.output
    body: dict[str, Any] = json.loads(result.stdout)
    return body


@pytest.fixture
def llama_3_70b(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_3_70B))
    return str(path)


def test_the_command_is_named_plan() -> None:
    assert plan_command.name == "plan"


def test_llama_3_70b_on_four_80_gib_gpus_recommends_a_max_inflight(llama_3_70b: str) -> None:
    result = plan("--config-json", llama_3_70b, "--gpu-mem", "80GiB", "--gpus", "4")
    assert result.exit_code == 0, result.output
    # 70,553,706,496 estimated parameters: 35,276,853,248 B of bf16 weights per GPU; the KV cache
    # gets 80 GiB x 0.9 - 2 GiB - that = 39,885,074,432 B, at 81,920 B per token per GPU.
    assert "70.55 B (estimated" in result.output
    assert "320.0 KiB (327.7 kB) = 2 x 80 layers x 8 KV heads x 128 head_dim x 2 B" in result.output
    assert "486,878 tokens" in result.output  # 39,885,074,432 / 81,920 = 486,878.4
    assert "380 at the expected length, 59 at the full context" in result.output  # / 1,280 and / 8,192
    assert "Set max_inflight: 342" in result.output  # 90% of 380
    assert "429 + Retry-After" in result.output


def test_flags_override_the_config(llama_3_70b: str) -> None:
    body = plan_json(
        "--config-json", llama_3_70b, "--params", "70B", "--dtype", "fp8", "--gpu-mem", "80GB", "--gpus", "2"
    )
    assert body["shape"]["params_estimated"] is False
    assert body["serving_inputs"]["kv_dtype"] == "bf16"  # fp8 weights still keep a bf16 cache
    assert body["serving"]["weights_total"] == pytest.approx(70e9)


def test_weights_that_do_not_fit_exit_non_zero_with_a_clear_message() -> None:
    result = plan(*SHAPE_70B, "--gpu-mem", "80GiB", "--gpus", "1")
    assert result.exit_code == 1
    assert "DOES NOT FIT: the weights do not fit: 130.4 GiB per GPU" in result.stdout
    assert result.stderr.startswith("error: the weights do not fit")
    assert "max_inflight" not in result.stdout


def test_json_reports_a_misfit_and_still_exits_non_zero() -> None:
    result = plan(*SHAPE_70B, "--gpu-mem", "80GiB", "--json")
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert body["fits"] is False
    assert body["serving"]["problem"].startswith("the weights do not fit")


def test_json_carries_the_serving_plan() -> None:
    body = plan_json(
        *SHAPE_70B, "--gpu-mem", "80GiB", "--gpus", "4", "--prompt-tokens", "2048", "--output-tokens", "512"
    )
    assert body["fits"] is True
    assert body["serving"]["weights_total"] == pytest.approx(140e9)
    assert body["serving"]["kv_per_token"] == 327_680
    assert (body["serving"]["max_seqs_expected"], body["serving"]["max_inflight"]) == (191, 171)


def test_training_reports_failure_odds_and_the_checkpoint_interval() -> None:
    result = plan("--params", "70e9", "--train-gpus", "16000", "--afr", "0.02", "--ckpt-write", "60s")
    assert result.exit_code == 0, result.output
    assert "Serving: give --gpu-mem" in result.output
    assert "16  total" in result.output
    assert "1.02 TiB (1.12 TB)" in result.output
    assert "58.4% = 1 - (1 - AFR/365)^N" in result.output
    assert "(27.38 h)" in result.output
    assert "Young sqrt(2CM)" in result.output


def test_young_interval_from_flags_for_60_s_and_4_h() -> None:
    interval = plan_json("--params", "70e9", "--ckpt-write", "60s", "--mtbf", "4h")["interval"]
    assert (interval["write_s"], interval["mtbf_s"]) == (60, 14_400)
    assert round(interval["young_s"]) == 1315


def test_checkpoint_write_time_follows_from_size_and_bandwidth() -> None:
    body = plan_json("--params", "70e9", "--ckpt-bandwidth", "5GB/s", "--mtbf", "4h")
    assert body["interval"]["write_s"] == pytest.approx(1.12e12 / 5e9)  # 224 s for the 16 B/param state


def test_sgd_with_momentum_is_12_bytes_per_parameter_in_mixed_precision() -> None:
    body = plan_json("--params", "1e9", "--optimizer", "sgd")
    assert body["checkpoint"]["full_bytes_per_param"] == 12


@pytest.mark.parametrize(
    ("flag", "text", "field", "value"),
    [
        ("--gpu-mem", "80GiB", "gpu_mem", 80 * 2**30),
        ("--gpu-mem", "80GB", "gpu_mem", 80e9),
        ("--ckpt-bandwidth", "5GB/s", "ckpt_bandwidth", 5e9),
        ("--ckpt-write", "60s", "ckpt_write", 60),
        ("--mtbf", "4h", "mtbf", 14_400),
        ("--params", "8B", "params", 8e9),
        ("--overhead", "0GiB", "overhead", 0),
    ],
)
def test_sizes_rates_and_durations_parse_on_the_command_line(flag: str, text: str, field: str, value: float) -> None:
    base = ["--params", "8e9", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--context", "8192"]
    body = plan_json(*base, "--gpu-mem", "80GiB", flag, text)
    assert body["options"][field] == pytest.approx(value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-mem", "80"], "expected a size"),
        (["--ckpt-bandwidth", "40Gb/s"], "b is bits"),
        (["--ckpt-write", "a minute"], "expected a duration"),
        (["--gpu-mem", "0GB"], "must be positive"),
        (["--train-gpus", "16000"], "--train-gpus and --afr go together"),
        (["--params", "70e9", "--gpu-mem", "80GiB"], "serving needs --layers, --kv-heads, --head-dim, --context"),
        ([*SHAPE_70B, "--gpu-mem", "80GiB", "--prompt-tokens", "8192"], "exceed the context of 8192"),
    ],
)
def test_bad_input_is_a_usage_error_that_says_why(args: list[str], message: str) -> None:
    result = plan(*args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_config_without_the_architecture_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4096}))
    result = plan("--config-json", str(path))
    assert result.exit_code == 2
    assert "config.json has no 'num_attention_heads'" in result.stderr
