"""README.md's commands run as written (with free ports instead of its fixed ones)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.readme import ROOT, readme_block, run_block


def test_running_it_goes_from_nothing_to_an_answer_with_a_key(tmp_path: Path) -> None:
    ran = run_block(readme_block("Running it"), tmp_path)
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout.strip().splitlines()[-1])
    assert answer["choices"][0]["message"]["content"]
    # Only configured features are warned about: this config has no tools section.
    assert "WARNING" not in ran.stderr, ran.stderr


def lint_command() -> str:
    [line] = [line for line in readme_block("Development").splitlines() if line.startswith("ruff ")]
    return line.split("#")[0].strip()


def test_ci_runs_the_documented_lint_command() -> None:
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert lint_command() in ci


def test_the_documented_ruff_commands_pass_on_this_checkout() -> None:
    """ruff is quick; mypy (the command's last part) runs in CI and before each commit."""
    ruff_part = lint_command().removesuffix(" && mypy")
    assert "mypy" not in ruff_part
    command = ruff_part.replace("ruff ", f"{sys.executable} -m ruff ")
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
