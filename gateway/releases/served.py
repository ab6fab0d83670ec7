"""What a deployment says it serves, checked against the checkpoint a release pins.

A release names weights (a registry version and its path); only the server knows what it loaded.
OpenAI-compatible servers that load weights report them in `GET /v1/models`: vLLM gives each model
a `root`, the path or name it was started with (for a LoRA adapter, the adapter's path), and the
sim reports `--served-root`. `reported_root` is the one place that asks, so another way of asking
a kind of server slots in there. A deployment that reports nothing cannot be checked and is taken
at its word (logged); one that reports other weights fails the preflight.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx

from gateway.settings import DeploymentSettings

log = logging.getLogger(__name__)

_TIMEOUT_S = 5.0


async def reported_root(deployment: DeploymentSettings) -> str | None:
    """The `root` /v1/models reports for this deployment's model (or its LoRA adapter), if any."""
    served_name = deployment.load_hook.lora_name if deployment.load_hook and deployment.load_hook.lora_name else ""
    headers = {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
    async with httpx.AsyncClient(timeout=_TIMEOUT_S) as client:
        reply = await client.get(f"{str(deployment.api_base).rstrip('/')}/models", headers=headers)
    reply.raise_for_status()
    entries = [e for e in reply.json().get("data", []) if isinstance(e, dict)]
    for name in (served_name, deployment.model):
        for entry in entries:
            if name and entry.get("id") == name and isinstance(entry.get("root"), str):
                return str(entry["root"])
    return None


def _same(root: str, pin: dict[str, Any]) -> bool:
    if root == pin["version"]:
        return True
    return os.path.realpath(root.rstrip("/")) == os.path.realpath(str(pin["path"]).rstrip("/"))


async def served_problems(deployments: list[DeploymentSettings], pin: dict[str, Any] | None) -> list[str]:
    if pin is None:
        return []
    problems = []
    for deployment in deployments:
        try:
            root = await reported_root(deployment)
        except (httpx.HTTPError, ValueError) as error:
            problems.append(f"deployment {deployment.name}: could not ask what it serves ({error!r})")
            continue
        if root is None:
            log.info("deployment %s does not report what it serves; checkpoint %s not checked", deployment.name,
                     pin["version"])  # fmt: skip
        elif not _same(root, pin):
            problems.append(
                f"deployment {deployment.name} serves {root}, not checkpoint {pin['version']} ({pin['path']})"
            )
    return problems
