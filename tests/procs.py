"""Real processes for end-to-end tests: simulated backends and gateways on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from common.processes import Announced, start_announcing
from gateway.auth.stage import new_secret

FAST_SIM = ["--ttft-ms", "5", "--tpot-ms", "1", "--jitter", "0"]


def start_sim(*extra: str, port: int = 0) -> Announced:
    return start_announcing(["sim", "--port", str(port), *FAST_SIM, *extra])


def set_faults(sim: Announced, **faults: Any) -> None:
    httpx.put(f"{sim.url}/sim/control/faults", json=faults, timeout=5).raise_for_status()


def reset(sim: Announced) -> None:
    httpx.post(f"{sim.url}/sim/control/reset", timeout=5).raise_for_status()


def served_count(sim: Announced) -> int:
    control = httpx.get(f"{sim.url}/sim/control", timeout=5).json()
    return int(control["counters"]["requests"])


def deployment(name: str, sim: Announced, **overrides: Any) -> dict[str, Any]:
    return {
        "name": name,
        "api_base": f"{sim.url}/v1",
        "model": "sim-model",
        "continuation": "vllm",
        "timeouts": {"connect_s": 1, "first_token_s": 2, "stall_s": 1},
        **overrides,
    }


def gateway_config(*deployments: dict[str, Any], **sections: Any) -> dict[str, Any]:
    routing = {"retry": {"backoff_base_s": 0.01}, "health": {"interval_s": 30}, **sections.pop("routing", {})}
    return {
        "routing": routing,
        "models": [{"name": "sim-model", "deployments": list(deployments)}],
        **sections,
    }


@dataclass
class Gateway:
    """A gateway process with a bootstrap admin key and one chat key of tenant "acme"."""

    process: Announced
    admin_key: str
    key: str
    config_path: Path

    @property
    def url(self) -> str:
        return self.process.url

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def create_key(self, **fields: Any) -> tuple[str, str]:
        """(key id, secret) of a new key made through the admin API."""
        body = {"name": "test", "tenant": "acme", **fields}
        reply = httpx.post(f"{self.url}/admin/keys", json=body, headers=self.headers(self.admin_key), timeout=10)
        reply.raise_for_status()
        return reply.json()["key"]["id"], reply.json()["secret"]


@contextlib.contextmanager
def running_gateway(
    tmp_path: Path,
    config: dict[str, Any],
    env: dict[str, str] | None = None,
    admin_key: str | None = None,
    args: tuple[str, ...] = (),
    stderr: IO[str] | None = None,
) -> Iterator[Gateway]:
    """A gateway process (`args`: more `gateway serve` options; its log goes to `stderr`, by default
    the test's); replicas of one deployment share `admin_key` (and the config's store)."""
    config = {"store": {"kind": "embedded", "path": str(tmp_path / "data")}, **config}
    path = tmp_path / f"gateway-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump(config))
    admin_key = admin_key or new_secret()
    process = start_announcing(
        ["gateway", "serve", "--config", str(path), "--port", "0", *args],
        env={"GATEWAY_ADMIN_KEY": admin_key, **(env or {})},
        stderr=stderr,
    )
    try:
        gateway = Gateway(process, admin_key, "", path)
        gateway.key = gateway.create_key()[1]
        yield gateway
    finally:
        process.stop()


def redis_store_config(prefix: str) -> dict[str, Any]:
    # The shared Redis never goes down under these gateways: a read that outlives the shipped
    # 0.25 s timeout is the loaded machine, not an outage (outage tests set their own timeouts).
    return {
        "kind": "redis",
        "url": "redis://127.0.0.1:6379/0",
        "key_prefix": prefix,
        "socket_timeout_s": 3,
        "connect_timeout_s": 3,
    }


def delete_redis_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def start_redis() -> RedisServer:
    """A redis-server of the test's own on a free port (the test may kill it)."""
    import redis

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2, socket_timeout=0.2)
    try:
        for _ in range(200):  # a process start: bounded polling until it answers
            try:
                client.ping()
                return RedisServer(process, port)
            except redis.ConnectionError:
                if process.poll() is not None:
                    break
                time.sleep(0.05)
    finally:
        client.close()
    process.kill()
    raise RuntimeError(f"redis-server on port {port} did not start")


WEATHER_POLICY = """
policies:
  agent:
    tools:
      - {name: get_weather, risk: low}
bindings:
  tenants: {acme: agent}
"""


def policy_file(tmp_path: Path, text: str = WEATHER_POLICY) -> str:
    path = tmp_path / f"policy-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(text)
    return str(path)


def child_pids(pid: int) -> set[int]:
    """The living children of `pid`, from /proc (Linux)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process exited while we looked
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            children.add(int(stat.parent.name))
    return children


def is_running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: set[int], timeout_s: float = 15.0) -> set[int]:
    """Wait (bounded) until none of `pids` runs; return those that still ran, after killing them
    (so that a failing test leaves no orphan behind either)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in pids:  # reap those that are our children (pytest adopts orphans: tests/conftest.py)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        running = {pid for pid in pids if is_running(pid)}
        if not running or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return running
