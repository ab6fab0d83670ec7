"""Real vLLM (CPU build) processes for the `vllm` tests, and the tiny model they serve.

vLLM lives in its own virtualenv (`deploy/vllm/install.sh`; `AGW_VLLM_VENV`, default
~/.cache/agent-gateway/vllm-venv): installing it into the project's environment would move
pinned packages under the gateway. The model is built once per machine by
`deploy/vllm/tiny_model.py` and cached under a digest of that file.

A server runs in its own process group: vLLM's API server starts an engine-core process, and
"the server died" (SIGKILL) or "the server hangs" (SIGSTOP) must hit both.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "deploy" / "vllm" / "tiny_model.py"
INSTALL = REPO / "deploy" / "vllm" / "install.sh"
CACHE = Path(os.environ.get("AGW_CACHE_DIR", Path.home() / ".cache" / "agent-gateway"))
VENV = Path(os.environ.get("AGW_VLLM_VENV", CACHE / "vllm-venv"))
STAMP = VENV / ".agw-vllm-stamp"
# A busy 2-core machine took 45-160 s per engine start; several start at once here.
START_TIMEOUT_S = float(os.environ.get("AGW_VLLM_START_TIMEOUT_S", "600"))
BUILD_TIMEOUT_S = 1800.0

# The flags every test server runs with (README "Running with vLLM" shows the same).
BASE_ARGS = [
    "--max-model-len", "1024",
    # float32 by default: free for this model, and no bf16 rounding in the argmax (AGW_VLLM_DTYPE).
    "--dtype", os.environ.get("AGW_VLLM_DTYPE", "float32"),
    "--enforce-eager",  # no torch.compile: the engine starts in a fraction of the time
    "--max-num-seqs", "8",
]  # fmt: skip
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
# Adapters of rank <= 8, two in a batch; the tests load them at run time (load_lora_adapter).
LORA_ARGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]


def vllm_python() -> Path | None:
    """The vLLM venv's python, or None when install.sh has not completed there."""
    python = VENV / "bin" / "python"
    return python if STAMP.is_file() and python.is_file() else None


def recipe_digest() -> str:
    return hashlib.sha256(RECIPE.read_bytes()).hexdigest()[:16]


def tiny_model(python: Path) -> Path:
    """The directory holding v1/ and v2/ of the tiny model; built (once per machine) if missing."""
    target = CACHE / "vllm-models" / f"tiny-{recipe_digest()}"
    if (target / "report.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building the same recipe
        if not (target / "report.json").is_file():
            subprocess.run(
                [str(python), str(RECIPE), str(target)],
                check=True,
                timeout=BUILD_TIMEOUT_S,
                env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
            )
    return target


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class VllmServer:
    name: str  # the served model name
    model_dir: Path
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    launched_at: float
    ready_s: float | None = None  # seconds from launch to a healthy /health
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        """Poll /health until it answers 200 (bounded); raise with the log's tail if it never does."""
        deadline = self.launched_at + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"vLLM {self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.ready_s = time.monotonic() - self.launched_at
                    return self
            time.sleep(0.5)  # an engine start takes tens of seconds: polling twice a second is plenty
        self.kill()
        raise RuntimeError(f"vLLM {self.name} not healthy within {timeout_s:g}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, signum: int) -> None:
        """Send `signum` to the API server and its engine core alike."""
        if self.alive:
            os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL: what a crashed or OOM-killed server looks like to the gateway."""
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGKILL)
        self.process.wait(30)
        self._reap_group()

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()  # a stopped process would never act on SIGTERM
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait(30)
        self._reap_group()

    def _reap_group(self) -> None:
        # The engine core may outlive a killed API server for a moment: nothing of ours may stay.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def restarted(self) -> VllmServer:
        """The same server (name, model, port, flags) launched again; call wait_ready on it."""
        return launch(self.name, self.model_dir, self.log_path.parent, self.args, port=self.port)


def launch(name: str, model_dir: Path, log_dir: Path, args: list[str] = (), port: int = 0) -> VllmServer:  # type: ignore[assignment]
    """Start a vLLM server without waiting for it (engines start in parallel); see wait_ready."""
    python = vllm_python()
    if python is None:
        raise RuntimeError(f"no vLLM venv at {VENV}: run {INSTALL}")
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"vllm-{name}-{port}.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a share of the machine's memory
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # several servers share 2 cores with other work
        "OMP_NUM_THREADS": "1",
        # The model runs in the engine-core process, not a worker process of its own: ~30 s less.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if "--enable-lora" in args:
        # Without it vLLM has no /v1/load_lora_adapter, which the gateway's lora load hook calls.
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", name,
        "--host", "127.0.0.1",
        "--port", str(port),
        *BASE_ARGS,
        *args,
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: signals reach the engine core too
            close_fds=True,
        )
    return VllmServer(name, model_dir, port, process, log_path, time.monotonic(), args=list(args))
