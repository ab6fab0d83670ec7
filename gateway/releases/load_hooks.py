"""Bringing a stopped deployment back before a rollback switches traffic to it.

`lora`: vLLM serves adapters it is told to load (`POST /v1/load_lora_adapter`), so rolling back to
an adapter release is one request with the release's checkpoint path. `command`: anything else
(start a server, scale a deployment); the command is started and left running, since it may be the
server itself. Either way the deployment counts as back only once its health probe answers.

A command is started with `subprocess.Popen`, not the event loop's subprocess support: under uvloop
that does not close inherited descriptors, and the gateway's listening socket is inheritable, so a
model server started by a hook kept the gateway's port after the gateway stopped. It gets its own
session (a signal to the gateway's process group does not reach it) and writes its output to a
file named in the gateway's log; its last lines go into the log and the refusal when it fails.

On one engine a `lora` load is itself the traffic switch (clients address the adapter by name):
a rollback refused after it loaded gives the name back what it held (`give_back`).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.releases.served import reported_root
from gateway.settings import DeploymentSettings, LoadHook, LoadHookKind

log = logging.getLogger(__name__)

_POLL_S = 0.2
_TAIL_BYTES = 600


@dataclass(frozen=True, slots=True)
class LoadedAdapter:
    """An adapter loaded in place by a rollback, and what its name held before (None: nothing)."""

    deployment: DeploymentSettings
    hook: LoadHook
    previous: str | None


async def bring_up(
    deployment: DeploymentSettings,
    hook: LoadHook,
    checkpoint_path: str | None,
    healthy: Callable[[], Awaitable[bool]],
    started: list[subprocess.Popen[bytes]],
) -> str | None:
    """Run the hook and wait for health; None when the deployment is back, else the problem."""
    process: subprocess.Popen[bytes] | None = None
    output: Path | None = None
    if hook.kind is LoadHookKind.COMMAND:
        launched, output = await asyncio.to_thread(_start, deployment.name, hook.command)
        started.append(launched)  # not waited for: the command may be the server itself
        process = launched
    else:
        problem = await _load_lora(deployment, hook, checkpoint_path)
        if problem:
            return problem
    deadline = time.monotonic() + hook.timeout_s
    while not await healthy():
        # A launcher (docker start, kubectl scale) exits 0 and the server comes up later; a failure
        # exits non-zero, and waiting out the timeout would only hide it.
        if process is not None and output is not None and process.poll() not in (None, 0):
            tail = _tail(output)
            log.error("load hook of %s exited with status %s: %s", deployment.name, process.returncode, tail)
            return f"deployment {deployment.name}: its load hook exited with status {process.returncode}: {tail}"
        if time.monotonic() >= deadline:
            return f"deployment {deployment.name} was not healthy {hook.timeout_s:g}s after its load hook"
        await asyncio.sleep(_POLL_S)
    return None


def _start(name: str, command: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    with tempfile.NamedTemporaryFile(prefix=f"agw-load-hook-{name}-", suffix=".log", delete=False) as sink:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
        )
    log.info("load hook of %s started (pid %d), its output goes to %s", name, process.pid, sink.name)
    return process, Path(sink.name)


def _tail(output: Path) -> str:
    try:
        with output.open("rb") as file:
            file.seek(max(0, output.stat().st_size - _TAIL_BYTES))
            text = file.read().decode(errors="replace")
    except OSError as error:
        return f"(its output {output} is unreadable: {error.strerror})"
    return " | ".join(line.strip() for line in text.splitlines() if line.strip()) or "(no output)"


async def _load_lora(deployment: DeploymentSettings, hook: LoadHook, checkpoint_path: str | None) -> str | None:
    if checkpoint_path is None:
        return f"deployment {deployment.name}: a lora load hook needs a release with a checkpoint"
    # In place: clients address the adapter by its name, so the release's weights replace whatever
    # the name holds (vLLM refuses a loaded name otherwise: "has already been loaded").
    body = {"lora_name": hook.lora_name or deployment.model, "lora_path": checkpoint_path, "load_inplace": True}
    return await _post(deployment, hook, "load_lora_adapter", body)


async def _post(deployment: DeploymentSettings, hook: LoadHook, action: str, body: dict[str, object]) -> str | None:
    headers = {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=hook.timeout_s) as client:
            reply = await client.post(f"{deployment.api_base}/{action}", json=body, headers=headers)
    except httpx.HTTPError as error:
        return f"deployment {deployment.name}: {action} failed: {error!r}"
    if reply.status_code >= 400:
        return f"deployment {deployment.name}: {action} answered {reply.status_code}: {reply.text[:200]}"
    return None


async def give_back(loaded: Sequence[LoadedAdapter]) -> str:
    """Load back what each name held before (unload it when it held nothing); say what each
    deployment serves now, as its server reports it."""
    said = []
    for entry in loaded:
        deployment = entry.deployment
        if entry.previous is None:
            problem = await _unload_lora(deployment, entry.hook)
        else:
            problem = await _load_lora(deployment, entry.hook, entry.previous)
        if problem:
            log.error("giving back what %s served before the rollback: %s", deployment.name, problem)
        answered, now = await reported_root(deployment)
        state = (now or "no adapter under its name") if answered else "an adapter it does not say (listing failed)"
        said.append(f"deployment {deployment.name} now serves {state}" + (f" ({problem})" if problem else ""))
    return "; ".join(said)


async def _unload_lora(deployment: DeploymentSettings, hook: LoadHook) -> str | None:
    body: dict[str, object] = {"lora_name": hook.lora_name or deployment.model}
    return await _post(deployment, hook, "unload_lora_adapter", body)
