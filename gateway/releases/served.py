"""What a deployment really serves, as the model server says: the link between a release's pinned
checkpoint and the weights behind its deployments.

vLLM lists each served model on `GET /v1/models` with `root`: the `--model` directory for the base
model, the adapter path for a LoRA adapter (`lora_name` -> `lora_path`). A release that pins a
checkpoint is refused when one of its deployments reports a different `root`. Servers that do not
report one (the sim, hosted APIs) cannot be checked: they are recorded as unknown, not refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from enum import Enum
from pathlib import PurePosixPath

import httpx

from gateway.settings import DeploymentSettings, LoadHookKind

_TIMEOUT_S = 5.0


def served_name(deployment: DeploymentSettings) -> str:
    """The model id the deployment is addressed with (a LoRA hook's adapter when it has one)."""
    hook = deployment.load_hook
    if hook is not None and hook.kind is LoadHookKind.LORA:
        return hook.lora_name or deployment.model
    return deployment.model


async def served_root(deployment: DeploymentSettings) -> str | None:
    """The `root` the server reports for the deployment's model; None when it says nothing."""
    _, root = await reported_root(deployment)
    return root


async def reported_root(deployment: DeploymentSettings) -> tuple[bool, str | None]:
    """Whether the server answered its model listing, and the `root` it reports for the
    deployment's model there (None: not listed, or listed without one)."""
    headers = {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=_TIMEOUT_S) as client:
            reply = await client.get(f"{deployment.api_base}/models", headers=headers)
        models = reply.json().get("data") if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return False, None  # unreachable or not JSON: the health check reports the deployment itself
    if not isinstance(models, list):
        return False, None
    name = served_name(deployment)
    for entry in models:
        if isinstance(entry, dict) and entry.get("id") == name and isinstance(entry.get("root"), str):
            return True, str(entry["root"])
    return True, None


class Adapter(Enum):
    SERVED = "served"  # the server lists the pinned adapter under the deployment's name
    TO_LOAD = "to load"  # it lists another one, or none, under that name
    UNKNOWN = "unknown"  # its model listing failed: what it holds cannot be told


async def adapter_to_load(deployment: DeploymentSettings, pinned: str | None) -> Adapter:
    """Whether a LoRA deployment's server must be told to load the pinned adapter under its name.

    A healthy engine says nothing about which adapter it holds: rolling back on one engine means
    loading the old adapter into a server that is up, so the load hook must run for this too. A
    failed listing is not a reason to load: that would replace the adapter of a healthy engine
    serving traffic on a transient error."""
    hook = deployment.load_hook
    if pinned is None or hook is None or hook.kind is not LoadHookKind.LORA:
        return Adapter.SERVED
    answered, root = await reported_root(deployment)
    if not answered:
        return Adapter.UNKNOWN
    return Adapter.SERVED if root is not None and same_checkpoint(root, pinned) else Adapter.TO_LOAD


async def served_roots(deployments: Sequence[DeploymentSettings]) -> dict[str, str | None]:
    roots = await asyncio.gather(*(served_root(d) for d in deployments))
    return {d.name: root for d, root in zip(deployments, roots, strict=True)}


def same_checkpoint(served: str, pinned: str) -> bool:
    """Same directory, compared by its last two parts (`<run>/step-<n>`): the server may mount the
    registry elsewhere than the gateway sees it."""
    return PurePosixPath(served.rstrip("/")).parts[-2:] == PurePosixPath(pinned.rstrip("/")).parts[-2:]


def mismatches(pinned: str, served: dict[str, str | None]) -> list[str]:
    return [
        f"deployment {name} serves {root}, not the pinned checkpoint {pinned}"
        for name, root in sorted(served.items())
        if root is not None and not same_checkpoint(root, pinned)
    ]
