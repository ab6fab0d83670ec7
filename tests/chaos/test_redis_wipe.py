"""A Redis that comes back empty (restarted without persistence) is noticed, not silent
(issue 12 item 6: 153/264 requests got 401 while /readyz said ready, and `audit verify` passed
on a chain restarted at seq 1)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from testkit.procs import deployment, gateway_config, gateway_process
from tests.chaos.redis_chaos import Tally, private_redis, steady_load, wait_ready

pytestmark = pytest.mark.chaos


async def test_a_wiped_redis_makes_replicas_not_ready_and_audit_verify_report_the_gap(
    tmp_path: Path, sim_pair: list[Announced]
) -> None:
    with private_redis(tmp_path) as server:
        config = gateway_config(
            deployment("a", sim_pair[0]),
            # Killed, not stalled: refusals are immediate; the timeout only has to outlast a slow fsync.
            store={"kind": "redis", "url": server.url, "key_prefix": "chaos", "socket_timeout_s": 2},
        )
        with gateway_process(tmp_path, config) as gateway:
            await wait_ready(gateway, within_s=20)
            tally = Tally()
            await steady_load([gateway], asyncio.Event(), tally, concurrency=2, max_requests=10)
            assert tally.statuses[200] == tally.total >= 10
            server.kill()
            for leftover in server.workdir.rglob("*"):  # the data is gone: a disposable Redis
                if leftover.is_file():
                    leftover.unlink()
            server.start()
            restarted = time.monotonic()
            deadline = time.monotonic() + 20
            async with httpx.AsyncClient(timeout=5) as client:
                while True:
                    readiness = await client.get(f"{gateway.url}/readyz")
                    if readiness.json()["store"] == "wiped":
                        break
                    assert time.monotonic() < deadline, readiness.text
                    await asyncio.sleep(0.1)
                assert readiness.status_code == 503
                detected_after = time.monotonic() - restarted
                assert "epoch changed" in readiness.json()["store_error"]
                deadline = time.monotonic() + 20
                while not server.client().exists("chaos:{audit}:head"):  # the store_wiped record
                    assert time.monotonic() < deadline, "no store_wiped audit record"
                    await asyncio.sleep(0.1)
            verify = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "gateway", "audit", "verify", "--config", str(gateway.config_path)],
                capture_output=True,
                text=True,
                timeout=60,
            )
    print(
        f"\nwipe: requests before={tally.total} {dict(tally.statuses)}, not ready {detected_after:.2f} s after restart"
    )
    assert verify.returncode == 1
    assert "DISCONTINUITY" in verify.stderr
    assert "wiped" in verify.stderr
