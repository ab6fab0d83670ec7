from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sim.cli import sim_command


def test_bad_fault_option_is_a_usage_error_before_anything_starts() -> None:
    result = CliRunner().invoke(sim_command, ["--port", "0", "--fault", "explode=1"])
    assert result.exit_code == 2
    assert "--fault" in result.output


def test_bad_profile_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("ttft_ms: -5\n")
    result = CliRunner().invoke(sim_command, ["--port", "0", "--profile", str(path)])
    assert result.exit_code == 2
    assert "ttft_ms" in result.output
