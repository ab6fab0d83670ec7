"""`gateway plan`: the memory and KV-cache arithmetic to do before choosing GPU count,
quantization and concurrency, and the checkpoint arithmetic of training the same model.

The serving section needs --gpu-mem; the failure and checkpoint-interval lines need --train-gpus
with --afr (or --mtbf). The report ends with the `max_inflight` to configure for the deployment.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import planning
from planning import CheckpointInterval, CheckpointSizes, ModelShape, ServingInputs, ServingPlan


class _Parsed(click.ParamType[float]):
    def __init__(self, name: str, parse: Callable[[str], float], allow_zero: bool = False) -> None:
        self.name = name
        self._parse = parse
        self._allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        try:
            number = self._parse(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if number < 0 or (number == 0 and not self._allow_zero):
            self.fail(f"{value!r}: must be positive", param, ctx)
        return number


SIZE = _Parsed("size", planning.parse_size)
BANDWIDTH = _Parsed("rate", planning.parse_bandwidth)
DURATION = _Parsed("duration", planning.parse_duration)
COUNT = _Parsed("count", planning.parse_count)
_POSITIVE = click.IntRange(min=1)
_FRACTION = click.FloatRange(0, 1, min_open=True)

_OPTIONS = (
    click.option("--config-json", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="HF config.json"),
    click.option("--params", type=COUNT, help="e.g. 70e9 or 70B [default: estimated from --config-json]"),
    click.option("--layers", type=_POSITIVE, help="num_hidden_layers"),
    click.option("--kv-heads", type=_POSITIVE, help="num_key_value_heads"),
    click.option("--head-dim", type=_POSITIVE, help="head_dim"),
    click.option("--dtype", type=click.Choice(list(planning.DTYPE_BYTES)), help="weights [default: torch_dtype|bf16]"),
    click.option("--kv-dtype", type=click.Choice(planning.KV_DTYPES), help="[default: --dtype; bf16 if quantized]"),
    click.option("--gpu-mem", type=SIZE, help="memory of one GPU, e.g. 80GiB or 80GB; enables the serving section"),
    click.option("--gpus", type=_POSITIVE, default=1, show_default=True, help="GPUs per deployment (tensor parallel)"),
    click.option("--context", type=_POSITIVE, help="max sequence length [default: max_position_embeddings]"),
    click.option("--prompt-tokens", type=_POSITIVE, default=1024, show_default=True, help="expected prompt length"),
    click.option("--output-tokens", type=_POSITIVE, default=256, show_default=True, help="expected output length"),
    click.option("--gpu-util", type=_FRACTION, default=0.9, show_default=True, help="vLLM gpu_memory_utilization"),
    click.option(
        "--overhead",
        type=_Parsed("size", planning.parse_size, allow_zero=True),
        default="2GiB",
        show_default=True,
        help="per GPU: activations, CUDA graphs",
    ),
    click.option("--margin", type=_FRACTION, default=0.9, show_default=True, help="max_inflight / fit"),
    click.option("--optimizer", type=click.Choice(planning.OPTIMIZERS), default="adam", help="sgd: with momentum"),
    click.option("--precision", type=click.Choice(planning.PRECISIONS), default="mixed", show_default=True),
    click.option("--train-gpus", type=_POSITIVE, help="GPUs in the training job"),
    click.option("--afr", type=click.FloatRange(0, min_open=True), help="annual failure rate of one GPU, e.g. 0.02"),
    click.option("--mtbf", type=DURATION, help="cluster MTBF, e.g. 4h [default: from --train-gpus and --afr]"),
    click.option("--ckpt-write", type=DURATION, help="checkpoint write time, e.g. 60s"),
    click.option("--ckpt-bandwidth", type=BANDWIDTH, help="derives --ckpt-write from the size, e.g. 5GB/s"),
    click.option("--json", "as_json", is_flag=True, help="machine-readable output"),
)


@dataclasses.dataclass(frozen=True)
class Options:
    config_json: Path | None
    params: float | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    dtype: str | None
    kv_dtype: str | None
    gpu_mem: float | None
    gpus: int
    context: int | None
    prompt_tokens: int
    output_tokens: int
    gpu_util: float
    overhead: float
    margin: float
    optimizer: str
    precision: str
    train_gpus: int | None
    afr: float | None
    mtbf: float | None
    ckpt_write: float | None
    ckpt_bandwidth: float | None
    as_json: bool


@dataclasses.dataclass(frozen=True)
class Report:
    options: Options
    shape: ModelShape
    serving_inputs: ServingInputs | None
    serving: ServingPlan | None
    checkpoint: CheckpointSizes | None
    failure_per_day: float | None
    interval: CheckpointInterval | None
    notes: tuple[str, ...]


def _shape(opts: Options) -> ModelShape:
    """The config.json's figures, each overridden by its flag."""
    base = ModelShape()
    if opts.config_json is not None:
        try:
            base = planning.shape_from_config(planning.read_config_json(opts.config_json))
        except (ValueError, TypeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--config-json") from None
    return dataclasses.replace(
        base,
        layers=opts.layers or base.layers,
        kv_heads=opts.kv_heads or base.kv_heads,
        head_dim=opts.head_dim or base.head_dim,
        params=opts.params or base.params,
        params_estimated=base.params_estimated and opts.params is None,
        dtype=opts.dtype or base.dtype or "bf16",
        max_context=opts.context or base.max_context,
    )


def _serving_inputs(opts: Options, shape: ModelShape) -> ServingInputs | None:
    if opts.gpu_mem is None:
        return None
    flags = {"--params": shape.params, "--layers": shape.layers, "--kv-heads": shape.kv_heads}
    flags |= {"--head-dim": shape.head_dim, "--context": shape.max_context}
    missing = ", ".join(flag for flag, value in flags.items() if value is None)
    p, layers, kv_heads, head_dim, context = (
        shape.params,
        shape.layers,
        shape.kv_heads,
        shape.head_dim,
        shape.max_context,
    )
    if p is None or layers is None or kv_heads is None or head_dim is None or context is None:
        raise click.UsageError(f"serving needs {missing} (or a --config-json that has them)")
    if opts.prompt_tokens + opts.output_tokens > context:
        raise click.UsageError(f"--prompt-tokens plus --output-tokens exceed the context of {context}")
    dtype = shape.dtype or "bf16"
    kv_dtype = opts.kv_dtype or planning.default_kv_dtype(dtype)
    return ServingInputs(
        p,
        layers,
        kv_heads,
        head_dim,
        dtype,
        kv_dtype,
        opts.gpu_mem,
        opts.gpus,
        context,
        opts.prompt_tokens,
        opts.output_tokens,
        opts.gpu_util,
        opts.overhead,
        opts.margin,
    )


def _mtbf(opts: Options) -> float | None:
    if (opts.train_gpus is None) != (opts.afr is None):
        raise click.UsageError("--train-gpus and --afr go together")
    if opts.mtbf is not None:
        return opts.mtbf
    if opts.train_gpus is not None and opts.afr is not None:
        return planning.cluster_mtbf_s(opts.train_gpus, opts.afr)
    return None


def _write_time(opts: Options, sizes: CheckpointSizes | None) -> float | None:
    """An explicit --ckpt-write wins; otherwise the full training state over the bandwidth,
    the conservative reading of "checkpoint size"."""
    if opts.ckpt_write is not None:
        return opts.ckpt_write
    if opts.ckpt_bandwidth is not None and sizes is not None:
        return sizes.full_bytes / opts.ckpt_bandwidth
    return None


def build_report(opts: Options) -> Report:
    shape = _shape(opts)
    inputs = _serving_inputs(opts, shape)
    sizes = planning.checkpoint_sizes(shape.params, opts.optimizer, opts.precision) if shape.params else None
    mtbf, write_s = _mtbf(opts), _write_time(opts, sizes)
    notes: list[str] = []
    if opts.ckpt_bandwidth is not None and sizes is None and opts.ckpt_write is None:
        notes.append("--ckpt-bandwidth needs a parameter count (--params or --config-json) to size the checkpoint")
    if mtbf is not None and write_s is None:
        notes.append("give --ckpt-write or --ckpt-bandwidth for the checkpoint interval")
    if write_s is not None and mtbf is None:
        notes.append("give --train-gpus with --afr, or --mtbf, for the checkpoint interval")
    failures = None
    if opts.train_gpus is not None and opts.afr is not None:
        failures = planning.failure_probability_per_day(opts.train_gpus, opts.afr)
    return Report(
        options=opts,
        shape=shape,
        serving_inputs=inputs,
        serving=planning.plan_serving(inputs) if inputs else None,
        checkpoint=sizes,
        failure_per_day=failures,
        interval=planning.checkpoint_interval(write_s, mtbf) if mtbf and write_s else None,
        notes=tuple(notes),
    )


_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_DECIMAL = ("B", "kB", "MB", "GB", "TB", "PB")


def _scaled(n: float, base: int, units: tuple[str, ...]) -> str:
    power = 0
    while power < len(units) - 1 and abs(n) >= base ** (power + 1):
        power += 1
    value = n / base**power
    return f"{n:,.0f} B" if power == 0 else f"{value:,.{2 if value < 10 else 1}f} {units[power]}"


def _size(n: float) -> str:
    """Both units: GPU memory is quoted in GiB, disks, links and checkpoints in GB."""
    return f"{_scaled(n, 1024, _BINARY)} ({_scaled(n, 1000, _DECIMAL)})"


def _duration(seconds: float) -> str:
    """Days only from two on: an MTBF of 27 h reads better than 1.14 days."""
    for unit, span in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= (2 * span if unit == "days" else span):
            return f"{seconds:,.0f} s ({seconds / span:,.2f} {unit})"
    return f"{seconds:,.1f} s"


def _model_lines(report: Report) -> list[str]:
    shape, source = report.shape, report.options.config_json
    lines = ["Model", f"  source                {source if source else 'flags'}"]
    if shape.params:
        how = "estimated from config.json's architecture; --params overrides" if shape.params_estimated else "given"
        lines.append(f"  parameters            {shape.params / 1e9:,.2f} B ({how})")
    if shape.experts and shape.active_params:
        lines.append(
            f"                        MoE: {shape.experts} experts, {shape.active_params / 1e9:,.2f} B active per token"
        )
    if shape.layers and shape.kv_heads and shape.head_dim:
        lines.append(
            f"  shape                 {shape.layers} layers, {shape.kv_heads} KV heads, head_dim {shape.head_dim}"
        )
    return lines


def _serving_lines(inp: ServingInputs, plan: ServingPlan) -> list[str]:
    kv_b = planning.DTYPE_BYTES[inp.kv_dtype]
    lines = [
        f"Serving: one deployment, tensor-parallel over {inp.gpus} x {_size(inp.gpu_mem)}",
        f"  dtypes                weights {inp.dtype} ({planning.DTYPE_BYTES[inp.dtype]:g} B/param), "
        f"KV cache {inp.kv_dtype}",
        f"  weights               {_size(plan.weights_total)} total, {_size(plan.weights_per_gpu)} per GPU",
        f"  budget per GPU        {_size(plan.budget_per_gpu)} = gpu_util {inp.gpu_util:g} x GPU memory, "
        f"of which {_size(inp.overhead)} overhead",
        f"  KV cache per token    {_size(plan.kv_per_token)} = 2 x {inp.layers} layers x {inp.kv_heads} KV heads "
        f"x {inp.head_dim} head_dim x {kv_b:g} B",
    ]
    if plan.kv_heads_per_gpu * inp.gpus > inp.kv_heads:
        lines.append(
            f"                        replicated: {plan.kv_heads_per_gpu} KV head(s) on each of {inp.gpus} GPUs"
        )
    lines += [
        f"  KV cache per sequence {_size(plan.kv_per_seq_expected)} at the expected {plan.expected_tokens:,} tokens "
        f"({inp.prompt_tokens:,} prompt + {inp.output_tokens:,} output)",
        f"                        {_size(plan.kv_per_seq_context)} at the full context of {inp.context:,} tokens",
        f"  KV cache available    {_size(plan.kv_available_per_gpu)} per GPU, {_size(plan.kv_available_total)} "
        f"in all: {plan.kv_token_capacity:,} tokens",
    ]
    if plan.problem is not None:
        return [
            *lines,
            "",
            *textwrap.wrap(f"DOES NOT FIT: {plan.problem}", 96, initial_indent="  ", subsequent_indent="  "),
        ]
    return [
        *lines,
        f"  concurrent sequences  {plan.max_seqs_expected:,} at the expected length, "
        f"{plan.max_seqs_context:,} at the full context",
        f"  max_inflight          {plan.max_inflight:,} ({inp.margin:.0%} of {plan.max_seqs_expected:,}, at least 1)",
        "",
        f"  Set max_inflight: {plan.max_inflight} on this deployment in the gateway config. The gateway then admits",
        "  at most that many requests and answers the rest with 429 + Retry-After, so the running",
        "  sequences' KV cache stays inside the backend's memory: vLLM need not preempt (and recompute)",
        "  running sequences, and a burst cannot push it toward OOM. Counting every sequence at its final",
        "  length is conservative; the margin covers block rounding and longer-than-expected requests.",
        "  vLLM also runs at most --max-num-seqs sequences at once; admitted requests beyond that wait in",
        "  its queue, which costs latency but not memory.",
    ]


def _checkpoint_lines(sizes: CheckpointSizes, params: float) -> list[str]:
    lines = [
        f"Training: {sizes.optimizer}, {sizes.precision} precision, {params / 1e9:,.2f} B parameters",
        "  bytes/param  state                              needed to resume",
    ]
    for part in sizes.components:
        lines.append(f"  {part.bytes_per_param:>11g}  {part.name:<34} {'yes' if part.needed_to_resume else 'no'}")
    weights_dtype = "bf16" if sizes.precision == "mixed" else "fp32"
    return [
        *lines,
        f"  {sizes.full_bytes_per_param:>11g}  total",
        "  checkpoint size",
        f"    full training state              {sizes.full_bytes_per_param:>3g} B/param  {_size(sizes.full_bytes)}",
        f"    without half copies or gradients {sizes.resume_bytes_per_param:>3g} B/param  {_size(sizes.resume_bytes)}",
        f"    weights only ({weights_dtype})              {sizes.weights_bytes_per_param:>3g} B/param  "
        f"{_size(sizes.weights_bytes)}",
    ]


def _reliability_lines(report: Report) -> list[str]:
    opts, lines = report.options, []
    if report.failure_per_day is not None and opts.train_gpus is not None and opts.afr is not None:
        lines += [
            f"  failures: {opts.train_gpus:,} GPUs at an annual failure rate of {opts.afr:g}",
            f"    P(at least one GPU fails per day)  {report.failure_per_day:.1%} = 1 - (1 - AFR/365)^N",
            f"    cluster MTBF                       {_duration(planning.cluster_mtbf_s(opts.train_gpus, opts.afr))}",
        ]
    ival = report.interval
    if ival is not None:
        lines += [
            f"  checkpoint interval for write time C = {_duration(ival.write_s)}, MTBF M = {_duration(ival.mtbf_s)}",
            *(["    (C = the full training state over --ckpt-bandwidth)"] if opts.ckpt_write is None else []),
            f"    Young sqrt(2CM)  {_duration(ival.young_s):<28} time lost ~ {ival.lost_at_young:.1%}",
            f"    Daly             {_duration(ival.daly_s):<28} time lost ~ {ival.lost_at_daly:.1%}",
            "    time lost ~ C/tau + tau/(2M): writing checkpoints plus redoing half an interval per failure",
        ]
        if ival.write_s >= 2 * ival.mtbf_s:
            lines.append("    C >= 2M: checkpoints take longer than failures allow; write faster or shard the state")
    return lines


def render_text(report: Report) -> str:
    sections = [_model_lines(report)]
    if report.serving is not None and report.serving_inputs is not None:
        sections.append(_serving_lines(report.serving_inputs, report.serving))
    else:
        sections.append(["Serving: give --gpu-mem (and --gpus) to plan a deployment"])
    if report.checkpoint is not None and report.shape.params:
        sections.append(_checkpoint_lines(report.checkpoint, report.shape.params) + _reliability_lines(report))
    elif _reliability_lines(report):
        sections.append(["Training", *_reliability_lines(report)])
    if report.notes:
        sections.append(["Notes", *(f"  {note}" for note in report.notes)])
    return "\n\n".join("\n".join(section) for section in sections)


def render_json(report: Report) -> str:
    body = dataclasses.asdict(report)
    body["fits"] = report.serving is None or report.serving.problem is None
    return json.dumps(body, indent=2, default=str)


def _with_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


@click.command("plan")
@_with_options
def plan_command(**options: Any) -> None:
    """Memory, KV-cache and concurrency arithmetic for serving a model with vLLM behind the
    gateway, and checkpoint size, failure odds and checkpoint interval for training it.

    \b
    gateway plan --config-json config.json --gpu-mem 80GiB --gpus 4
    gateway plan --params 70e9 --layers 80 --kv-heads 8 --head-dim 128 --context 8192 \\
                 --gpu-mem 80GB --gpus 4 --dtype fp8 --kv-dtype fp8
    gateway plan --params 70B --train-gpus 16000 --afr 0.02 --ckpt-bandwidth 5GB/s
    """
    opts = Options(**options)
    report = build_report(opts)
    click.echo(render_json(report) if opts.as_json else render_text(report))
    if report.serving is not None and report.serving.problem is not None:
        click.echo(f"error: {report.serving.problem}", err=True)
        sys.exit(1)
