"""Two gateway replicas on one Redis: limits hold exactly, not limit x replicas."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from gateway.auth.stage import new_secret
from gateway.tokens import estimate_prompt_tokens
from testkit.procs import (
    Gateway,
    delete_redis_prefix,
    deployment,
    gateway_config,
    redis_store_config,
    running_gateway,
    set_faults,
    start_sim,
)

BODY: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "count me"}], "max_tokens": 4}


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Gateway, Gateway, Announced]]:
    """Two gateway processes sharing one Redis prefix, over one sim this test may stall."""
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    sim = start_sim()
    admin_key = new_secret()
    config = gateway_config(
        deployment("a", sim, timeouts={"connect_s": 10, "first_token_s": 3, "stall_s": 3}, max_inflight=1000),
        # Generous connect and Redis timeouts: 500 requests at once on two cores (beside the rest of
        # the suite) delay the event loop past the defaults, and this test is about exact counting,
        # not about timeouts.
        store={**redis_store_config(prefix), "socket_timeout_s": 3, "connect_timeout_s": 3},
        quota={"on_store_error": "fail_closed"},  # a store timeout must show, not admit unmetered
        routing={"retry": {"max_attempts": 1}},
    )
    try:
        with ExitStack() as stack:
            first = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            second = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            yield first, second, sim
    finally:
        sim.stop()
        delete_redis_prefix(prefix)


async def fire(replicas: tuple[Gateway, Gateway], key: str, count: int, body: dict[str, Any]) -> Counter[int]:
    """`count` concurrent requests, alternating between the replicas; returns statuses."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def one(i: int) -> int:
            gateway = replicas[i % 2]
            reply = await client.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(key))
            if reply.status_code == 429:
                assert "Retry-After" in reply.headers
                assert reply.json()["error"]["code"] in ("rate_limit_exceeded", "insufficient_quota", "retry_too_early")
            return reply.status_code

        return Counter(await asyncio.gather(*(one(i) for i in range(count))))


async def test_rpm_of_50_admits_exactly_50_of_500_across_two_replicas(
    replicas: tuple[Gateway, Gateway, Announced],
) -> None:
    first, second, _ = replicas
    _, key = first.create_key(rpm=50)
    statuses = await fire((first, second), key, 500, BODY)
    assert statuses[200] == 50, statuses
    assert statuses[429] == 450, statuses


async def test_max_concurrency_of_5_admits_exactly_5_across_two_replicas(
    replicas: tuple[Gateway, Gateway, Announced],
) -> None:
    first, second, sim = replicas
    _, key = first.create_key(max_concurrency=5)
    set_faults(sim, stall_after=0)  # admitted requests hold their slot until the first-token timeout
    statuses = await fire((first, second), key, 60, BODY)
    assert statuses[429] == 55
    assert statuses[504] == 5


async def test_token_budget_admits_exactly_what_it_covers_across_two_replicas(
    replicas: tuple[Gateway, Gateway, Announced],
) -> None:
    first, second, sim = replicas
    reserved_per_request = estimate_prompt_tokens(BODY) + BODY["max_tokens"]
    _, key = first.create_key(tpm=7 * reserved_per_request + reserved_per_request // 2)
    set_faults(sim, stall_after=0)  # nothing settles while the test counts admissions
    statuses = await fire((first, second), key, 60, BODY)
    assert statuses[429] == 53
    assert statuses[504] == 7


def test_daily_budget_refusal_is_insufficient_quota(replicas: tuple[Gateway, Gateway, Announced]) -> None:
    first, _, _ = replicas
    _, key = first.create_key(daily_tokens=1)
    reply = httpx.post(f"{first.url}/v1/chat/completions", json=BODY, headers=first.headers(key), timeout=10)
    assert reply.status_code == 429
    assert reply.json()["error"]["code"] == "insufficient_quota"


def test_rate_limit_headers_follow_openai(replicas: tuple[Gateway, Gateway, Announced]) -> None:
    first, _, _ = replicas
    _, key = first.create_key(rpm=10, tpm=100_000)
    reply = httpx.post(f"{first.url}/v1/chat/completions", json=BODY, headers=first.headers(key), timeout=10)
    assert reply.status_code == 200
    assert reply.headers["x-ratelimit-limit-requests"] == "10"
    assert reply.headers["x-ratelimit-remaining-requests"] == "9"
    assert reply.headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(reply.headers["x-ratelimit-remaining-tokens"]) < 100_000
    assert reply.headers["x-ratelimit-reset-requests"].endswith("s")


def test_revocation_reaches_the_other_replica_within_the_cache_ttl(
    replicas: tuple[Gateway, Gateway, Announced],
) -> None:
    first, second, _ = replicas
    key_id, key = first.create_key()
    ask: dict[str, Any] = {"json": BODY, "headers": first.headers(key), "timeout": 10}
    assert httpx.post(f"{second.url}/v1/chat/completions", **ask).status_code == 200  # now cached on `second`
    revoked = httpx.post(f"{first.url}/admin/keys/{key_id}/revoke", headers=first.headers(first.admin_key), timeout=10)
    revoked.raise_for_status()
    assert httpx.post(f"{first.url}/v1/chat/completions", **ask).status_code == 401
    time.sleep(1.0)  # auth.cache_ttl_s: the bound this test checks, not a synchronisation guess
    assert httpx.post(f"{second.url}/v1/chat/completions", **ask).status_code == 401
