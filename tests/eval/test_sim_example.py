from __future__ import annotations

from pathlib import Path

from eval.gate import Thresholds, check_gate
from eval.runner import run_eval
from eval.sets import load_eval_set

EXAMPLE = Path(__file__).resolve().parents[2] / "eval" / "examples" / "smoke.yaml"


async def test_example_set_passes_every_case_against_a_real_sim(sim_url: str) -> None:
    result = await run_eval(load_eval_set(EXAMPLE), sim_url, None, "sim-model", timeout_s=10)
    assert [(case.case_id, case.passed, case.error, case.failures) for case in result.cases] == [
        ("short-reply-hits-limit", True, None, ()),
        ("plain-lowercase-words", True, None, ()),
        ("weather-tool-call", True, None, ()),
    ]
    assert result.summary.pass_rate == 1.0
    assert check_gate(result, Thresholds(tag_min_pass_rate={"tools": 1.0, "format": 1.0})).passed
