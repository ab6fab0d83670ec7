"""Error messages a newcomer meets say what is wrong and what to do, once."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gateway.auth.stage import new_secret, presented_secret
from gateway.cli.main import cli
from gateway.errors import AuthenticationFailed

MODELS = [{"name": "m", "deployments": [{"name": "d", "api_base": "http://127.0.0.1:9/v1", "model": "m"}]}]


def test_a_broken_config_names_the_file_once_and_the_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [\n  - {name: x\n")
    result = CliRunner().invoke(cli, ["config", "check", str(broken)])
    assert result.exit_code == 2
    assert result.output.count("broken.yaml") == 1, result.output
    assert "line 2" in result.output
    assert "<unicode string>" not in result.output


def test_a_missing_config_names_the_file_once(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["config", "check", str(tmp_path / "nowhere.yaml")])
    assert result.exit_code == 2
    assert result.output.count("nowhere.yaml") == 1, result.output


def test_rollback_with_nothing_earlier_names_the_flag(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({"store": {"kind": "embedded", "path": str(tmp_path / "data")}, "models": MODELS}))
    result = CliRunner().invoke(cli, ["releases", "rollback", "m", "--config", str(config)])
    assert result.exit_code == 1
    assert "--to" in result.output
    assert "to_version" not in result.output


@pytest.mark.parametrize(
    ("secret", "expected"),
    [
        ("sk-0123456789", "start with 'agw_'"),
        ("agw_short", "47 characters"),
        (new_secret() + "x", "47 characters"),
    ],
    ids=["no-prefix", "too-short", "one-too-long"],  # fixed ids: a random secret must not name a test
)
def test_a_malformed_key_is_told_what_is_wrong(secret: str, expected: str) -> None:
    with pytest.raises(AuthenticationFailed) as caught:
        presented_secret({"authorization": f"Bearer {secret}"})
    assert expected in caught.value.message
    assert secret not in caught.value.message  # never echo a secret


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def run_gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_serve_on_a_busy_port_says_so_in_one_line(busy_port: int, tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({"store": {"kind": "embedded", "path": str(tmp_path / "data")}, "models": MODELS}))
    line = one_line(run_gateway("serve", "--config", str(config), "--port", str(busy_port), "--log-level", "error"))
    assert f"port {busy_port}" in line
    assert "--port 0" in line


def test_sim_on_a_busy_port_says_so_in_one_line(busy_port: int) -> None:
    line = one_line(run_gateway("sim", "--port", str(busy_port)))
    assert f"port {busy_port}" in line
    assert "--port 0" in line


def test_demo_on_a_busy_port_says_so_in_one_line(busy_port: int, tmp_path: Path) -> None:
    line = one_line(run_gateway("demo", "--port", str(busy_port), "--sim-ports", "0,0"))
    assert f"port {busy_port}" in line
    assert "--port 0" in line
    line = one_line(run_gateway("demo", "--port", "0", "--sim-ports", f"0,{busy_port}"))
    assert f"port {busy_port}" in line
    assert "--sim-ports 0,0" in line
