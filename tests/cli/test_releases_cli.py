"""The release and checkpoint commands read like the rest of the CLI: a table for people (`--json`
for machines), `--config` everywhere, one `eval` command."""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml
from click.testing import CliRunner

from gateway.cli.main import cli
from tests.checkpoints.fixtures import make_safetensors


def config(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    document = {
        "store": {"kind": "embedded", "path": str(tmp_path / "data")},
        "releases": {"checkpoint_registry": str(tmp_path / "registry")},
        "models": [{"name": "m", "deployments": [{"name": "d", "api_base": "http://127.0.0.1:9/v1", "model": "m"}]}],
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_releases_list_is_a_table_and_json_on_request(tmp_path: Path) -> None:
    path = config(tmp_path)
    for version in ("v1", "v2"):
        created = CliRunner().invoke(cli, ["releases", "create", "m", "--config", str(path), "--version", version])
        assert created.exit_code == 0, created.output
    table = CliRunner().invoke(cli, ["releases", "list", "m", "--config", str(path)])
    assert table.exit_code == 0, table.output
    header = table.output.splitlines()[0].split()
    assert header[:2] == ["VERSION", "CHECKPOINT"]
    assert "active: none" in table.output
    machine = CliRunner().invoke(cli, ["releases", "list", "m", "--config", str(path), "--json"])
    assert [r["version"] for r in orjson.loads(machine.output)["releases"]] == ["v1", "v2"]


def test_checkpoints_take_the_config_like_everything_else(tmp_path: Path) -> None:
    path = config(tmp_path)
    weights = make_safetensors(tmp_path / "ckpt")
    registered = CliRunner().invoke(
        cli, ["checkpoints", "register", str(weights), "--run", "ft", "--step", "1", "--config", str(path)]
    )
    assert registered.exit_code == 0, registered.output
    assert (tmp_path / "registry").is_dir()
    listed = CliRunner().invoke(cli, ["checkpoints", "list", "--root", str(tmp_path / "registry")])
    assert "ft@1" in listed.output


def test_there_is_one_eval_command() -> None:
    import click

    names = cli.list_commands(click.Context(cli))
    assert "eval" in names
    assert "evals" not in names
