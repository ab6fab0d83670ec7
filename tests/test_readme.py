"""README.md's commands run as written (with free ports instead of its fixed ones)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from common.processes import Announced
from testkit.procs import deployment, gateway_config, running_gateway
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


def test_the_documented_ruff_and_import_checks_pass_on_this_checkout() -> None:
    """ruff and lint-imports are quick; mypy (the command's last part) runs in CI and before each commit."""
    quick_part = lint_command().removesuffix(" && mypy")
    assert "mypy" not in quick_part
    assert "lint-imports" in quick_part
    command = quick_part.replace("ruff ", f"{sys.executable} -m ruff ")
    command = command.replace("lint-imports", str(Path(sys.executable).parent / "lint-imports"))
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_keys_and_audit_blocks_run_as_written(tmp_path: Path) -> None:
    """After 'Running it' (a store with keys and requests in it), as a reader goes on."""
    first = run_block(readme_block("Running it"), tmp_path)
    assert first.returncode == 0, first.stderr
    keys = run_block(readme_block("Keys, quotas and the audit log", 0), tmp_path)
    assert keys.returncode == 0, keys.stderr
    assert "revoked key_" in keys.stdout
    audit = run_block(readme_block("Keys, quotas and the audit log", 1), tmp_path)
    assert audit.returncode == 0, audit.stderr
    assert "store: ok" in audit.stdout


def test_the_session_snippet_counts_an_event_only_once_its_data_arrived(
    sim_pair: list[Announced], tmp_path: Path
) -> None:
    snippet = readme_block("Sessions, resume and replica failover", language="python")
    with running_gateway(tmp_path, gateway_config(deployment("a", sim_pair[0]))) as gateway:
        code = snippet.replace("http://127.0.0.1:8080", gateway.url).replace("agw_...", gateway.key)
        code = code.replace("ticket-4711", f"ticket-{uuid.uuid4().hex[:8]}")
        namespace: dict[str, Any] = {}
        exec(compile(code, "README.md", "exec"), namespace)
        stream = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            headers=gateway.headers(),
            json={"model": "sim-model", "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
            timeout=30,
        )
    assert namespace["last_id"] == stream.text.count("\nid: ") + stream.text.startswith("id: ")
    assert namespace["r"].status_code == 200


def test_the_releases_walkthrough_runs_as_written(tmp_path: Path) -> None:
    ran = run_block(readme_block("Releases and rollback"), tmp_path, timeout_s=240)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    history = json.loads(ran.stdout[ran.stdout.rindex("\n{\n") :])
    assert history["active"] == "v1"
    assert [switch["to"] for switch in history["history"]][-2:] == ["v2", "v1"], history["history"]


def test_the_responses_snippet_runs_as_written(sim_pair: list[Announced], tmp_path: Path) -> None:
    snippet = readme_block("Responses API", language="python")
    with running_gateway(tmp_path, gateway_config(deployment("a", sim_pair[0]))) as gateway:
        code = snippet.replace("http://127.0.0.1:8080", gateway.url).replace("agw_...", gateway.key)
        namespace: dict[str, Any] = {}
        exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["response"].status == "incomplete"
    assert namespace["final"].status == "completed"
    assert namespace["final"].output_text


def test_the_messages_and_embeddings_snippets_run_as_written(sim_pair: list[Announced], tmp_path: Path) -> None:
    models = [
        {"name": "sim-model", "deployments": [deployment("a", sim_pair[0])]},
        {"name": "my-embedder", "deployments": [deployment("e1", sim_pair[0], serves=["embeddings"])]},
    ]
    with running_gateway(tmp_path, gateway_config(models=models)) as gateway:
        results: dict[str, dict[str, Any]] = {}
        for section in ("Anthropic Messages API", "Embeddings"):
            snippet = readme_block(section, language="python")
            code = snippet.replace("http://127.0.0.1:8080", gateway.url).replace("agw_...", gateway.key)
            results[section] = {}
            exec(compile(code, "README.md", "exec"), results[section])
    assert results["Anthropic Messages API"]["message"].stop_reason == "max_tokens"  # the sim writes max_tokens
    assert results["Anthropic Messages API"]["text"]
    assert len(results["Embeddings"]["vectors"].data) == 2
