"""Session fixtures for the `vllm` tests: the tiny model's two checkpoints, saved by the project's
training-side helper and registered, and a pool of vLLM engines started once per session.

Engines (all started at once, since each start takes a minute or more on a busy machine):
  a, b  checkpoint tiny@200 (v1), with the hermes tool parser: the failover pair
  c     checkpoint tiny@300 (v2), with LoRA enabled: the other side of the two-engine release test,
        and the engine whose adapters the LoRA release test switches (an engine of its own would
        cost another start)
A test that kills an engine restarts it (`pool.restart`) without waiting; the next test that
needs it waits in `pool.ready`. `AGW_VLLM_ENGINES=c` starts only the engines named up front (one
test on a shared machine); `pool.ready` launches any other engine a test asks for.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from checkpoints.registry import CheckpointRegistry
from checkpoints.training import save_checkpoint
from tests.vllm.servers import INSTALL, LORA_ARGS, TOOL_ARGS, VllmServer, launch, tiny_model, vllm_python

STEPS = {"v1": 200, "v2": 300}  # the run's step numbers of the two checkpoints
ENGINES = {"a": ("v1", TOOL_ARGS), "b": ("v1", TOOL_ARGS), "c": ("v2", LORA_ARGS)}
FIGURES = pytest.StashKey[dict[str, Any]]()


@dataclass
class Checkpoints:
    registry: CheckpointRegistry
    paths: dict[str, Path]  # "v1"/"v2" -> the registered step directory vLLM serves
    versions: dict[str, str]  # "v1"/"v2" -> registry version id, e.g. "tiny@200"


@dataclass
class Pool:
    servers: dict[str, VllmServer]
    figures: dict[str, Any]
    log_dir: Path
    paths: dict[str, Path]  # "v1"/"v2" -> the checkpoint directory an engine serves
    restarts: int = 0
    start_s: list[float] = field(default_factory=list)

    def ready(self, *names: str) -> list[VllmServer]:
        """The named engines, healthy (waiting for a start or restart in progress)."""
        ready = []
        for name in names:
            if name not in self.servers:
                self.launch(name)
            server = self.servers[name]
            if not server.alive:
                server = self.restart(name)
            if server.ready_s is None:
                server.wait_ready()
                self.start_s.append(round(server.ready_s or 0, 1))
                self.figures["engine_start_s"] = self.start_s
            ready.append(server)
        return ready

    def launch(self, name: str) -> None:
        label, args = ENGINES[name]
        self.servers[name] = launch("tiny", self.paths[label], self.log_dir, list(args))

    def restart(self, name: str) -> VllmServer:
        """Launch a killed engine again on its port; `ready` waits for it."""
        old = self.servers[name]
        old.kill()
        self.servers[name] = old.restarted()
        self.restarts += 1
        self.figures["engine_restarts"] = self.restarts
        return self.servers[name]


def _copy_writer(source: Path) -> Any:
    """A `save_checkpoint` writer for a Hugging Face directory the trainer already wrote."""

    def write(directory: Path) -> None:
        for item in source.iterdir():
            shutil.copy2(item, directory / item.name)

    return write


@pytest.fixture(scope="session")
def vllm_python_path() -> Path:
    python = vllm_python()
    if python is None:
        message = f"vLLM is not installed for the tests: run {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it in .ci/run: its absence there is a failure
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def figures(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Measurements printed at the end of the session (engine starts, failover positions, ...)."""
    return request.config.stash.setdefault(FIGURES, {})


@pytest.fixture(scope="session")
def checkpoints(
    vllm_python_path: Path, tmp_path_factory: pytest.TempPathFactory, figures: dict[str, Any]
) -> Checkpoints:
    started = time.monotonic()
    built = tiny_model(vllm_python_path)
    figures["model_ready_s"] = round(time.monotonic() - started, 1)
    root = tmp_path_factory.mktemp("vllm-checkpoints")
    registry = CheckpointRegistry(root / "registry")
    paths, versions = {}, {}
    for label, step in STEPS.items():
        saved = save_checkpoint({}, root / "runs", "tiny", step, writer=_copy_writer(built / label), registry=registry)
        result = saved.result(timeout=60)
        assert result.entry is not None
        assert result.entry.format == "hf-safetensors"
        paths[label], versions[label] = result.path, result.version
    return Checkpoints(registry, paths, versions)


@pytest.fixture(scope="session")
def pool(checkpoints: Checkpoints, tmp_path_factory: pytest.TempPathFactory, figures: dict[str, Any]) -> Iterator[Pool]:
    log_dir = tmp_path_factory.mktemp("vllm-logs")
    up_front = os.environ.get("AGW_VLLM_ENGINES", ",".join(ENGINES)).split(",")
    pool = Pool({}, figures, log_dir, checkpoints.paths)
    try:
        for name in up_front:
            pool.launch(name)
        yield pool
    finally:
        for server in pool.servers.values():
            server.stop()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    found = config.stash.get(FIGURES, None)
    if found:
        terminalreporter.section("vLLM figures")
        for key, value in sorted(found.items()):
            terminalreporter.write_line(f"{key}: {value}")
