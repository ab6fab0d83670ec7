"""A private, killable, persistent redis-server and the load and checks the Redis chaos scenarios
share. Never the session's Redis (tests/conftest.py), which other tests share: these servers are
SIGKILLed and restarted on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from gateway.audit.writer import iterate
from gateway.settings import RedisStoreSettings
from gateway.store.redis_store import RedisStore
from testkit.procs import Gateway

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 3}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PrivateRedis:
    """redis-server on a fixed free port with its data in `workdir` (AOF, fsync on every write,
    so a SIGKILL loses nothing and a restart finds every key): the same server comes back."""

    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=0.2, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 15
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    if client.ping():
                        return
                assert self.process.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not answer PING"
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def restart_after(self, down_s: float) -> None:
        self.kill()
        time.sleep(down_s)  # the outage itself is the scenario, not a wait for a condition
        self.start()
        self.restarts += 1


@contextlib.contextmanager
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    workdir = tmp_path / f"redis-{free_port()}"
    workdir.mkdir()
    server = PrivateRedis(free_port(), workdir)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    request_ids: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # what each non-answer looked like

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


async def steady_load(
    gateways: Sequence[Gateway],
    stop: asyncio.Event,
    tally: Tally,
    *,
    concurrency: int,
    max_requests: int,
    label: str = "chaos",
) -> None:
    """`concurrency` clients round-robin over the gateways until `stop` (or `max_requests`)."""
    async with httpx.AsyncClient(timeout=15) as client:

        async def worker(index: int) -> None:
            n = 0
            while not stop.is_set() and tally.total < max_requests:
                gateway = gateways[(index + n) % len(gateways)]
                n += 1
                request_id = f"{label}-{index}-{n}"
                headers = {**gateway.headers(), "X-Request-Id": request_id}
                url = f"{gateway.url}/v1/chat/completions"
                try:
                    if index % 2:  # streams too: they take session checkpoints through every outage
                        async with client.stream("POST", url, json={**BODY, "stream": True}, headers=headers) as r:
                            body = b"".join([part async for part in r.aiter_bytes()])
                            status = r.status_code if body.endswith(b"data: [DONE]\n\n") else 0
                            if status == 0 or b'"error"' in body:
                                tally.failures.append(f"{request_id}: {body[-300:]!r}")
                                status = status if b'"error"' not in body else 0
                    else:
                        reply = await client.post(url, json=BODY, headers=headers)
                        status = reply.status_code
                        if status != 200:
                            tally.failures.append(f"{request_id}: {status} {reply.text[:300]}")
                except httpx.HTTPError as error:
                    status = 0  # no answer at all: counted, and the scenario fails on it
                    tally.failures.append(f"{request_id}: {error!r}")
                tally.statuses[status] += 1
                tally.request_ids.append(request_id)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))


async def wait_ready(gateway: Gateway, within_s: float) -> float:
    """Seconds until /readyz answers 200 (fails the test after `within_s`)."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{gateway.url}/readyz")).status_code == 200:
                    return time.monotonic() - started
            assert time.monotonic() - started < within_s, f"{gateway.url} not ready within {within_s} s"
            await asyncio.sleep(0.05)


async def audited(server: PrivateRedis, prefix: str = "chaos") -> list[dict[str, Any]]:
    """The audit chain in `server`, read the way `gateway audit verify` reads it."""
    store = RedisStore(RedisStoreSettings(url=server.url, key_prefix=prefix, socket_timeout_s=5))
    try:
        return [r.to_dict() async for r in iterate(store)]
    finally:
        await store.aclose()
