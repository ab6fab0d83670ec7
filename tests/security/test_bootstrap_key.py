"""Issue 11 Info / issue 13 item 4: a malformed bootstrap admin key let `gateway serve` start, and
every admin call was then a 401. It must fail at start, say what a valid key looks like and name
the command that prints one (`gateway keys generate`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gateway.auth.stage import SECRET_PREFIX, presented_secret
from gateway.cli.main import cli

CONFIG = {
    "store": {"kind": "embedded"},
    "models": [{"name": "m", "deployments": [{"name": "d", "api_base": "http://127.0.0.1:9/v1", "model": "m"}]}],
}


def serve(tmp_path: Path, admin_key: str) -> subprocess.CompletedProcess[str]:
    config = {**CONFIG, "store": {"kind": "embedded", "path": str(tmp_path / "data")}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "GATEWAY_ADMIN_KEY": admin_key}
    # A gateway that (wrongly) starts is killed by the timeout, which then fails the test.
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    "bad",
    ["changeme", "agw_short", "agw_" + "a" * 44, " agw_" + "a" * 43, "agw_" + "!" * 43],
    ids=["no-prefix", "too-short", "too-long", "whitespace", "not-base64url"],
)
def test_malformed_bootstrap_key_fails_serve_at_start(tmp_path: Path, bad: str) -> None:
    try:
        done = serve(tmp_path, bad)
    except subprocess.TimeoutExpired:
        pytest.fail("gateway serve started with a malformed GATEWAY_ADMIN_KEY")
    assert done.returncode == 2, done.stderr
    assert "GATEWAY_ADMIN_KEY" in done.stderr
    assert "'agw_' followed by 43 base64url characters" in done.stderr
    assert "gateway keys generate" in done.stderr
    assert bad.strip() not in done.stderr  # never echo a would-be secret


def test_keys_generate_prints_a_valid_key() -> None:
    result = CliRunner().invoke(cli, ["keys", "generate"])
    assert result.exit_code == 0, result.output
    secret = result.output.strip()
    assert secret.startswith(SECRET_PREFIX)
    assert presented_secret({"authorization": f"Bearer {secret}"}) == secret
    assert CliRunner().invoke(cli, ["keys", "generate"]).output.strip() != secret
