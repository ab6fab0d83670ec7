"""Real servers for end-to-end tests on 127.0.0.1: simulated backends and Redis as processes, gateways
in process (testkit/served.py) or, where the process is the point, as processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from common.processes import Announced, start_announcing
from gateway.auth.stage import new_secret
from gateway.settings import load_settings

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
    """A gateway with a bootstrap admin key and one chat key of tenant "acme"."""

    url: str
    admin_key: str
    key: str
    config_path: Path

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def create_key(self, **fields: Any) -> tuple[str, str]:
        """(key id, secret) of a new key made through the admin API."""
        body = {"name": "test", "tenant": "acme", **fields}
        reply = httpx.post(f"{self.url}/admin/keys", json=body, headers=self.headers(self.admin_key), timeout=10)
        reply.raise_for_status()
        return reply.json()["key"]["id"], reply.json()["secret"]


@dataclass
class GatewayProcess(Gateway):
    """A `gateway serve` process: for tests that kill, signal or restart it, or read its output."""

    process: Announced


def audit_records(
    gateway: Gateway, kind: str, done: Callable[[list[dict[str, Any]]], bool], within_s: float = 20.0
) -> list[dict[str, Any]]:
    """The gateway's audit records of `kind` once `done` holds for them, or as they are after
    `within_s`: the writer flushes in batches after the answer."""
    deadline = time.monotonic() + within_s
    while True:
        reply = httpx.get(
            f"{gateway.url}/admin/audit",
            params={"kind": kind, "limit": 1000},
            headers=gateway.headers(gateway.admin_key),
            timeout=10,
        )
        records: list[dict[str, Any]] = reply.json()["data"]
        if done(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def _config_file(tmp_path: Path, config: dict[str, Any]) -> Path:
    config = {"store": {"kind": "embedded", "path": str(tmp_path / "data")}, **config}
    path = tmp_path / f"gateway-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def running_gateway(tmp_path: Path, config: dict[str, Any], admin_key: str | None = None) -> Iterator[Gateway]:
    """A gateway served in this process (testkit/served.py), from the config file a process would
    read; replicas of one deployment share `admin_key` (and the config's store)."""
    from testkit.served import serve_in_thread

    path = _config_file(tmp_path, config)
    admin_key = admin_key or new_secret()
    settings = load_settings(path)
    settings = settings.model_copy(update={"auth": settings.auth.model_copy(update={"admin_key": admin_key})})
    with serve_in_thread(settings) as url:
        gateway = Gateway(url, admin_key, "", path)
        gateway.key = gateway.create_key()[1]
        yield gateway


@contextlib.contextmanager
def gateway_process(
    tmp_path: Path,
    config: dict[str, Any],
    env: dict[str, str] | None = None,
    admin_key: str | None = None,
    args: tuple[str, ...] = (),
    stderr: IO[str] | None = None,
) -> Iterator[GatewayProcess]:
    """A `gateway serve` process (`args`: more options; its log goes to `stderr`, by default the
    test's); replicas of one deployment share `admin_key` (and the config's store)."""
    path = _config_file(tmp_path, config)
    admin_key = admin_key or new_secret()
    process = start_announcing(
        ["gateway", "serve", "--config", str(path), "--port", "0", *args],
        env={"GATEWAY_ADMIN_KEY": admin_key, **(env or {})},
        stderr=stderr,
    )
    try:
        gateway = GatewayProcess(process.url, admin_key, "", path, process)
        gateway.key = gateway.create_key()[1]
        yield gateway
    finally:
        process.stop()


REDIS_URL_ENV = "AGW_TEST_REDIS_URL"


def shared_redis_url() -> str:
    """The URL of this test session's own redis-server (tests/conftest.py starts it on a free port
    and puts it in the environment, so gateways and CLIs the tests start inherit it too)."""
    url = os.environ.get(REDIS_URL_ENV)
    if not url:
        raise RuntimeError(
            f"{REDIS_URL_ENV} is not set: the session's Redis is started by the autouse `session_redis` "
            "fixture of tests/conftest.py, so only code that runs inside a test (or its fixtures) can use it"
        )
    return url


def redis_store_config(prefix: str) -> dict[str, Any]:
    # The session's Redis never goes down under these gateways: a read that outlives the shipped
    # 0.25 s timeout is the loaded machine, not an outage (outage tests set their own timeouts).
    return {
        "kind": "redis",
        "url": shared_redis_url(),
        "key_prefix": prefix,
        "socket_timeout_s": 3,
        "connect_timeout_s": 3,
    }


def delete_redis_prefix(prefix: str, url: str | None = None) -> None:
    """Delete every key under `prefix` on `url` (by default the session's Redis)."""
    import redis

    client = redis.Redis.from_url(url or shared_redis_url(), socket_timeout=5)
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


_PR_SET_PDEATHSIG = 1


def _exit_with_parent_hook() -> Callable[[], None] | None:
    """For Popen's preexec_fn (Linux, main thread only): the child asks the kernel for SIGKILL
    when the thread that started it exits, so a test process killed outright (no teardown) leaves
    no redis-server behind. prctl is looked up here, in the parent: the child only calls it."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return hook


def start_redis(timeout_s: float = 10.0, attempts: int = 5) -> RedisServer:
    """A redis-server of the caller's own on a free loopback port, without persistence (the test
    may kill it). The port is free when chosen, but another process (another test session) may
    take it before the server binds: the answering server must be ours (its pid), else retry."""
    for _ in range(attempts):
        server = _start_redis_once(timeout_s)
        if server is not None:
            return server
    raise RuntimeError(f"redis-server did not start on a free port in {attempts} attempts")


def _start_redis_once(timeout_s: float) -> RedisServer | None:
    import redis

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_exit_with_parent_hook()
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2, socket_timeout=0.2)
    deadline = time.monotonic() + timeout_s
    try:
        while process.poll() is None and time.monotonic() < deadline:  # bounded polling until it answers
            try:
                answering = int(client.info("server")["process_id"])
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.05)
                continue
            if answering == process.pid:
                return RedisServer(process, port)
            break  # another session's server took the port first: ours cannot bind it
    finally:
        client.close()
    timed_out = process.poll() is None and time.monotonic() >= deadline
    if process.poll() is None:
        process.kill()
    process.wait(10)
    if timed_out:
        raise RuntimeError(f"redis-server on port {port} did not answer within {timeout_s:g}s")
    return None


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
