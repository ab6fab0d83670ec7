"""The three processes behind the paths under test, each started with the configuration the
comparison needs: the fast upstream, this gateway (one process, one worker) and the LiteLLM
proxy (one worker, from its own virtualenv so it never changes the main environment)."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.support.procs import Service, free_port, running, start_announcing, start_polled
from common.processes import ProcessStartError

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = BENCH_DIR.parent
_FAST_UPSTREAM = Path(__file__).with_name("fast_upstream.py")  # run as a script: no package imports
# LiteLLM lives in its own virtualenv inside the checkout (gitignored), or wherever AGW_LITELLM_PYTHON points.
DEFAULT_LITELLM_PYTHON = Path(
    os.environ.get("AGW_LITELLM_PYTHON", REPO_DIR / "bench" / ".venv-litellm" / "bin" / "python")
)

# Everything LiteLLM would otherwise do besides proxying: phoning home, downloading the model cost
# map, logging at INFO. Spend and error logs need a database, which it does not get. It runs in a
# scratch directory, so that no .env file of this project is read.
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY_DISABLED": "true",
    "LITELLM_LOG": "ERROR",
}


def start_upstream(workdir: Path, chunks: int) -> Service:
    argv = [sys.executable, str(_FAST_UPSTREAM), "--port", "0", "--chunks", str(chunks)]
    return start_announcing("upstream", argv, workdir / "upstream.log", workdir, {}, timeout_s=15)


def start_floor(workdir: Path, upstream_url: str) -> Service:
    """bench/support/floor_proxy.py: the gateway's server and upstream client with nothing between."""
    argv = [sys.executable, "-m", "bench.support.floor_proxy", "--upstream", f"{upstream_url}/v1", "--port", "0"]
    return start_announcing("floor", argv, workdir / "floor.log", REPO_DIR, {}, timeout_s=15)


def new_gateway_secret() -> str:
    # The gateway's key format: `agw_` + 256 random bits, base64url without padding.
    return "agw_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def gateway_config(upstream_url: str, data_dir: Path, store: str = "", sessions: bool | None = None) -> str:
    """One deployment on the fast upstream. `store` replaces the embedded store in `data_dir` (the
    scratch directory: its default, ./data, is relative to the working directory, and the benchmark
    must leave nothing behind in the repository); `sessions` sets `sessions.enabled` when given."""
    store = store or f"{{kind: embedded, path: {data_dir}}}"
    sessions_line = "" if sessions is None else f"sessions: {{enabled: {str(sessions).lower()}}}\n"
    return f"""\
store: {store}
{sessions_line}routing:
  health: {{interval_s: 60}}
models:
  - name: fast
    deployments:
      - name: up
        api_base: {upstream_url}/v1
        model: fast
        max_inflight: 1024
"""


def serve_gateway(
    workdir: Path,
    config_text: str,
    admin_key: str,
    name: str = "gateway",
    stem: str = "gateway",
    source_dir: Path = REPO_DIR,
    extra_args: tuple[str, ...] = (),
    wrapper: tuple[str, ...] = (),
    timeout_s: float = 30.0,
) -> Service:
    """Run `python -m gateway serve` from `source_dir` (the repository, or another checkout to compare)
    with the configuration `config_text`, written with its log to `workdir/<stem>.yaml` and `.log`.
    `wrapper`: a command the server runs under (valgrind, say)."""
    config = workdir / f"{stem}.yaml"
    config.write_text(config_text)
    argv = [*wrapper, sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0", *extra_args]
    # The bootstrap admin key comes through the environment, which a gateway without auth ignores.
    env = {"GATEWAY_ADMIN_KEY": admin_key}
    return start_announcing(name, argv, workdir / f"{stem}.log", source_dir, env, timeout_s=timeout_s)


def start_gateway(workdir: Path, upstream_url: str, source_dir: Path, admin_key: str) -> Service:
    config = gateway_config(upstream_url, workdir / "gateway-data")
    return serve_gateway(workdir, config, admin_key, source_dir=source_dir)


def issue_gateway_key(gateway_url: str, admin_key: str) -> str:
    """A tenant key with the chat scope and no limits, minted through the admin API.

    Requests go through the ordinary key path (store lookup, cached), not the bootstrap admin
    key's shortcut. A gateway without the admin API accepts any bearer key, so that one is used.
    """
    body = orjson.dumps({"name": "bench", "tenant": "bench"})
    headers = {"Authorization": f"Bearer {admin_key}", "Content-Type": "application/json"}
    request = urllib.request.Request(f"{gateway_url}/admin/keys", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            secret = orjson.loads(response.read())["secret"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return admin_key
        raise ProcessStartError(f"gateway refused to issue a key: {exc.code} {exc.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError, KeyError, orjson.JSONDecodeError) as exc:
        raise ProcessStartError(f"could not issue a gateway key: {exc!r}") from None
    return str(secret)


def start_keyed_gateway(stack: contextlib.ExitStack, start: Callable[[str], Service]) -> tuple[Service, str]:
    """Start a gateway with a fresh admin key (`start(admin_key)`), stopped when `stack` closes,
    and mint a tenant key on it: (the gateway, the key its requests carry)."""
    admin_key = new_gateway_secret()
    gateway = stack.enter_context(running(start(admin_key)))
    return gateway, issue_gateway_key(gateway.url, admin_key)


def litellm_config(upstream_url: str, master_key: str) -> str:
    # A master key, as LiteLLM requires outside local development: every request is
    # authenticated, as it is by the gateway. Without a database it is the only kind of key.
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
  master_key: {master_key}
"""


def start_litellm(workdir: Path, python: Path, upstream_url: str, master_key: str) -> Service:
    config = workdir / "litellm.yaml"
    config.write_text(litellm_config(upstream_url, master_key))
    port = free_port()
    argv = [str(python), "-m", "litellm.proxy.proxy_cli", "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    url = f"http://127.0.0.1:{port}"
    log = workdir / "litellm.log"
    # Its startup imports a large tree: allow a minute on a busy 2-core machine.
    return start_polled("litellm", argv, log, workdir, LITELLM_ENV, url, "/health/readiness", timeout_s=90)


# Portkey's gateway (Node), installed with npm inside the checkout (gitignored) or where
# AGW_PORTKEY_DIR points:  npm install --prefix bench/.portkey @portkey-ai/gateway@1.15.2
DEFAULT_PORTKEY_DIR = Path(os.environ.get("AGW_PORTKEY_DIR", REPO_DIR / "bench" / ".portkey"))
PORTKEY_SERVER = Path("node_modules/@portkey-ai/gateway/build/start-server.js")


@dataclass(frozen=True)
class PortkeyCheck:
    server: Path | None  # start-server.js, or None when it is not available
    version: str | None
    reason: str  # why it is not available, or "" when it is


def check_portkey(directory: Path, disabled: bool) -> PortkeyCheck:
    if disabled:
        return PortkeyCheck(None, None, "skipped (--no-portkey)")
    server = directory / PORTKEY_SERVER
    if not server.exists():
        return PortkeyCheck(None, None, f"no Portkey gateway at {server} (see --portkey-dir)")
    try:
        manifest = orjson.loads((server.parent.parent / "package.json").read_bytes())
        version = str(manifest["version"])
    except (OSError, KeyError, orjson.JSONDecodeError) as exc:
        return PortkeyCheck(None, None, f"unreadable Portkey package.json: {exc!r}")
    return PortkeyCheck(server, version, "")


def start_portkey(workdir: Path, server: Path) -> Service:
    port = free_port()
    # It takes `--port=P` (a separate `--port P` is ignored) and `--headless` (no console UI).
    argv = ["node", str(server), f"--port={port}", "--headless"]
    url = f"http://127.0.0.1:{port}"
    return start_polled("portkey", argv, workdir / "portkey.log", workdir, {}, url, "/", timeout_s=60)


def portkey_headers(upstream_url: str) -> tuple[tuple[str, str], ...]:
    # Portkey forwards to any OpenAI-compatible host named per request.
    return (("x-portkey-provider", "openai"), ("x-portkey-custom-host", f"{upstream_url}/v1"))


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
        result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return LiteLLMCheck(None, None, f"{python} did not run: {exc}")
    if result.returncode != 0:
        return LiteLLMCheck(None, None, f"litellm is not installed for {python}")
    return LiteLLMCheck(python, result.stdout.strip(), "")
