"""The three processes behind the paths under test, each started with the configuration the
comparison needs: the fast upstream, this gateway (one process, one worker) and the LiteLLM
proxy (one worker, from its own virtualenv so it never changes the main environment)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from procs import Service, StartError, free_port, start_announcing, start_polled

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_LITELLM_PYTHON = Path("/work/bench-venv/bin/python")

# Everything LiteLLM would otherwise do besides proxying: phoning home, downloading the model cost
# map, logging at INFO. Spend and error logs need a database, which it does not get. It runs in a
# scratch directory, so that no .env file of this project is read.
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY_DISABLED": "true",
    "LITELLM_LOG": "ERROR",
}


def start_upstream(workdir: Path, chunks: int) -> Service:
    argv = [sys.executable, str(BENCH_DIR / "fast_upstream.py"), "--port", "0", "--chunks", str(chunks)]
    return start_announcing("upstream", argv, workdir / "upstream.log", REPO_DIR, {}, timeout_s=15)


def gateway_config(upstream_url: str) -> str:
    return f"""\
routing:
  health: {{interval_s: 60}}
models:
  - name: fast
    deployments:
      - name: up
        api_base: {upstream_url}/v1
        model: fast
        max_inflight: 1024
"""


def start_gateway(workdir: Path, upstream_url: str) -> Service:
    config = workdir / "gateway.yaml"
    config.write_text(gateway_config(upstream_url))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"]
    return start_announcing("gateway", argv, workdir / "gateway.log", REPO_DIR, {}, timeout_s=30)


def litellm_config(upstream_url: str) -> str:
    # No master key, so that LiteLLM authenticates nothing, like this gateway today; LiteLLM 1.108
    # refuses to start that way unless told that it is on purpose.
    return f"""\
model_list:
  - model_name: fast
    litellm_params:
      model: openai/fast
      api_base: {upstream_url}/v1
      api_key: dummy
litellm_settings:
  telemetry: false
  set_verbose: false
general_settings:
  disable_spend_logs: true
  disable_error_logs: true
  dangerously_permit_weak_or_unset_master_key: true
"""


def start_litellm(workdir: Path, python: Path, upstream_url: str) -> Service:
    config = workdir / "litellm.yaml"
    config.write_text(litellm_config(upstream_url))
    port = free_port()
    argv = [str(python), "-m", "litellm.proxy.proxy_cli", "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    url = f"http://127.0.0.1:{port}"
    log = workdir / "litellm.log"
    # Its startup imports a large tree: allow a minute on a busy 2-core machine.
    return start_polled("litellm", argv, log, workdir, LITELLM_ENV, url, "/health/readiness", timeout_s=90)


@dataclass(frozen=True)
class LiteLLMCheck:
    python: Path | None
    version: str | None
    reason: str  # why it is not available, or "" when it is


def check_litellm(python: Path | None, disabled: bool) -> LiteLLMCheck:
    if disabled:
        return LiteLLMCheck(None, None, "skipped (--no-litellm)")
    if python is None or not python.exists():
        return LiteLLMCheck(None, None, f"no python for LiteLLM at {python} (see --litellm-python)")
    probe = "import importlib.metadata as m; print(m.version('litellm'))"
    try:
        result = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return LiteLLMCheck(None, None, f"{python} did not run: {exc}")
    if result.returncode != 0:
        return LiteLLMCheck(None, None, f"litellm is not installed for {python}")
    return LiteLLMCheck(python, result.stdout.strip(), "")


__all__ = ["DEFAULT_LITELLM_PYTHON", "LiteLLMCheck", "Service", "StartError", "check_litellm"]
