"""A real Redis Cluster on loopback: three masters, each with one replica, in a temp dir.

`redis-server --cluster-enabled yes` on six free ports (each also needs its bus port, +10000,
free), then `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`. A short node
timeout lets the failover drill promote a replica within seconds. Everything is killed at the end.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

NODE_TIMEOUT_MS = 1000


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(count: int) -> list[int]:
    """Ports whose cluster bus port (+10000) is free too, both below the kernel's ephemeral range
    (32768 and up on Linux): a port free when checked there could be taken by any outgoing
    connection before redis-server binds it, and the node exits (seen once in three runs)."""
    found: list[int] = []
    rng = random.Random()
    for _ in range(2000):  # bounded: a busy machine still has plenty of free pairs
        port = rng.randrange(12000, 22700)
        if port not in found and _free(port) and _free(port + 10000):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError("no free port pairs for a Redis Cluster")


@dataclass
class ClusterNode:
    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    options: tuple[str, ...] = ()  # more redis-server options

    def start(self) -> None:
        command = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "yes", "--save", "",
            *self.options,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class RedisCluster:
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """A live node's URL (the client discovers the others from it)."""
        return f"redis://127.0.0.1:{self.live()[0].port}/0"

    def live(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def master_of(self, key: str) -> ClusterNode:
        """The node currently serving `key`'s slot as master."""
        for node in self.live():
            with contextlib.suppress(redis.RedisError), contextlib.closing(node.client()) as client:
                slot = client.cluster("KEYSLOT", key)
                for start, end, master, *_ in client.cluster("SLOTS"):
                    if start <= slot <= end:
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError("no live node")

    def masters(self) -> list[ClusterNode]:
        """The nodes serving slots as masters now."""
        with contextlib.closing(self.live()[0].client()) as client:
            ports = {int(master[1]) for _, _, master, *_ in client.cluster("SLOTS")}
        return [n for n in self.nodes if n.port in ports]

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        """The node replicating `master`."""
        with contextlib.closing(master.client()) as client:
            nodes: dict[str, dict[str, Any]] = client.cluster("NODES")
        ports = {info["node_id"]: int(address.split("@")[0].rsplit(":", 1)[1]) for address, info in nodes.items()}
        master_id = next(node_id for node_id, port in ports.items() if port == master.port)
        port = next(ports[info["node_id"]] for info in nodes.values() if info.get("master_id") == master_id)
        return next(n for n in self.nodes if n.port == port)

    def wait_ok(self, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while True:
            states = []
            for node in self.live():
                with contextlib.suppress(redis.RedisError), contextlib.closing(node.client()) as client:
                    states.append(client.cluster("INFO")["cluster_state"])
            if states and all(state == "ok" for state in states):
                return
            assert time.monotonic() < deadline, f"cluster not ok: {states}"
            time.sleep(0.1)


@contextlib.contextmanager
def running_cluster(
    root: Path, masters: int = 3, replicas: int = 1, options: tuple[str, ...] = ()
) -> Iterator[RedisCluster]:
    cluster = RedisCluster()
    try:
        for port in free_cluster_ports(masters * (1 + replicas)):
            workdir = root / f"node-{port}"
            workdir.mkdir(parents=True)
            node = ClusterNode(port, workdir, options=options)
            node.start()
            cluster.nodes.append(node)
        for node in cluster.nodes:
            _wait_ping(node)
        addresses = [f"127.0.0.1:{n.port}" for n in cluster.nodes]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        cluster.wait_ok()
        _wait_replicas_synced(cluster, masters * replicas)
        yield cluster
    finally:
        for node in cluster.nodes:
            node.kill()


def _wait_ping(node: ClusterNode) -> None:
    deadline = time.monotonic() + 15
    with contextlib.closing(redis.Redis(port=node.port, socket_timeout=0.2, socket_connect_timeout=0.2)) as client:
        while True:
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                if client.ping():
                    return
            assert node.process is not None
            assert node.process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, f"redis-server on {node.port} did not answer"
            time.sleep(0.02)


def _wait_replicas_synced(cluster: RedisCluster, expected: int, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        synced = 0
        for node in cluster.live():
            with contextlib.suppress(redis.RedisError), contextlib.closing(node.client()) as client:
                info = client.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") == "up":
                    synced += 1
        if synced >= expected:
            return
        assert time.monotonic() < deadline, f"{synced}/{expected} replicas in sync"
        time.sleep(0.1)
