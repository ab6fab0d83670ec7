"""Active health probes: one background task per deployment, each probe bounded by a timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.errors import UpstreamError
from gateway.routing.deployment import Deployment
from gateway.settings import HealthSettings
from gateway.tasks import cancel_and_wait


class HealthMonitor:
    def __init__(self, deployments: Sequence[Deployment], settings: HealthSettings) -> None:
        self._deployments = list(deployments)
        self._settings = settings
        self._tasks: list[asyncio.Task[None]] = []

    async def probe(self, deployment: Deployment) -> bool:
        try:
            async with asyncio.timeout(self._settings.timeout_s):
                await deployment.backend.probe()
        except (UpstreamError, TimeoutError):
            ok = False
        else:
            ok = True
        deployment.record_probe(ok, self._settings.unhealthy_after)
        return ok

    async def _run(self, deployment: Deployment) -> None:
        while True:
            await self.probe(deployment)
            await asyncio.sleep(self._settings.interval_s)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(d), name=f"health:{d.name}") for d in self._deployments]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
