"""README.md's commands run as written (with free ports instead of its fixed ones)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.readme import readme_block, run_block


def test_running_it_goes_from_nothing_to_an_answer_with_a_key(tmp_path: Path) -> None:
    ran = run_block(readme_block("Running it"), tmp_path)
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout.strip().splitlines()[-1])
    assert answer["choices"][0]["message"]["content"]
    # Only configured features are warned about: this config has no tools section.
    assert "WARNING" not in ran.stderr, ran.stderr
