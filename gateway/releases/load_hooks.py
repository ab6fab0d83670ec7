"""Bringing a stopped deployment back before a rollback switches traffic to it.

`lora`: vLLM serves adapters it is told to load (`POST /v1/load_lora_adapter`), so rolling back to
an adapter release is one request with the release's checkpoint path. `command`: anything else
(start a server, scale a deployment); the command is started and left running, since it may be the
server itself. Either way the deployment counts as back only once its health probe answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from gateway.settings import DeploymentSettings, LoadHook, LoadHookKind

_POLL_S = 0.2


async def bring_up(
    deployment: DeploymentSettings,
    hook: LoadHook,
    checkpoint_path: str | None,
    healthy: Callable[[], Awaitable[bool]],
    started: list[asyncio.subprocess.Process],
) -> str | None:
    """Run the hook and wait for health; None when the deployment is back, else the problem."""
    if hook.kind is LoadHookKind.COMMAND:
        # Not awaited: the command may be the server itself, which must outlive this request.
        started.append(
            await asyncio.create_subprocess_exec(
                *hook.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    else:
        problem = await _load_lora(deployment, hook, checkpoint_path)
        if problem:
            return problem
    deadline = time.monotonic() + hook.timeout_s
    while not await healthy():
        if time.monotonic() >= deadline:
            return f"deployment {deployment.name} was not healthy {hook.timeout_s:g}s after its load hook"
        await asyncio.sleep(_POLL_S)
    return None


async def _load_lora(deployment: DeploymentSettings, hook: LoadHook, checkpoint_path: str | None) -> str | None:
    if checkpoint_path is None:
        return f"deployment {deployment.name}: a lora load hook needs a release with a checkpoint"
    body = {"lora_name": hook.lora_name or deployment.model, "lora_path": checkpoint_path}
    headers = {"Authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=hook.timeout_s) as client:
            reply = await client.post(f"{deployment.api_base}/load_lora_adapter", json=body, headers=headers)
    except httpx.HTTPError as error:
        return f"deployment {deployment.name}: load_lora_adapter failed: {error!r}"
    if reply.status_code >= 400:
        return f"deployment {deployment.name}: load_lora_adapter answered {reply.status_code}: {reply.text[:200]}"
    return None
