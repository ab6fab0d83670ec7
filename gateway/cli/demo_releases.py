"""`gateway demo --releases`: what README's releases walkthrough starts from.

In the demo's data folder: two small checkpoints (`out/ft-100`, `out/ft-200`, LoRA-adapter
layout; the bytes are placeholders, which the sim does not read), the registry `ckpts` with
`ft@100` registered, `gw.yaml` (the demo's own config, for the CLI), the smoke eval set, and
release `v1` (`ft@100` on `sim-1`), promoted. It runs the same commands the walkthrough shows, so
what it leaves is what they leave.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import click
import yaml

STEPS = (100, 200)


def releases_settings(data_dir: Path) -> dict[str, Any]:
    return {"checkpoint_registry": str(data_dir / "ckpts")}


def prepare_releases(data_dir: Path, settings: dict[str, Any]) -> str:
    """Write the walkthrough's starting point into `data_dir`; a line saying what is there."""
    for step in STEPS:
        checkpoint = data_dir / "out" / f"ft-{step}"
        checkpoint.mkdir(parents=True)
        config = {"base_model_name_or_path": "sim-model", "peft_type": "LORA", "r": 8, "step": step}
        (checkpoint / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (checkpoint / "adapter_model.safetensors").write_bytes(hashlib.sha256(b"ft-%d" % step).digest() * 64)
    eval_set = data_dir / "smoke.yaml"
    eval_set.write_text(files("eval.examples").joinpath("smoke.yaml").read_text())
    config_path = data_dir / "gw.yaml"
    config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
    _gateway("checkpoints", "register", str(data_dir / "out/ft-100"), "--run", "ft", "--step", "100")
    _gateway(
        "releases", "create", "sim-model", "--config", str(config_path), "--version", "v1",
        "--checkpoint", "ft@100", "--deployments", "sim-1", "--system-prompt", "You are a helpful assistant.",
        "--prompt-version", "p6", "--eval-set", str(eval_set),
    )  # fmt: skip
    _gateway("releases", "promote", "sim-model", "v1", "--config", str(config_path))
    return (
        f"Releases: v1 (checkpoint ft@100 on sim-1) is active. In {data_dir}: out/ft-200 to register, "
        "gw.yaml for --config, smoke.yaml; README 'Releases and rollback' walks on from here."
    )


def _gateway(*args: str) -> None:
    """One `gateway` command, in this process, its output kept unless it fails."""
    from gateway.cli.main import cli

    if args[0] == "checkpoints":
        args = (*args, "--root", str(Path(args[2]).parents[1] / "ckpts"))
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            cli.main(list(args), prog_name="gateway", standalone_mode=False)
    except click.ClickException as error:
        raise click.ClickException(f"gateway {' '.join(args)}: {error.message}\n{output.getvalue()}") from None
