from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sim.app import create_sim_app
from sim.profile import SimProfile


@pytest.fixture
def fast_profile() -> SimProfile:
    return SimProfile(ttft_ms=1, tpot_ms=1, jitter=0, model_ids=["sim-model", "sim-large"])


@pytest.fixture
async def client(fast_profile: SimProfile) -> AsyncIterator[httpx.AsyncClient]:
    app = create_sim_app(fast_profile)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
        yield http
