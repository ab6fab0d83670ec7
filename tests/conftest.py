from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.processes import Announced
from testkit.procs import REDIS_URL_ENV, child_pids, reset, start_redis, start_sim, wait_gone
from tests.cluster.redis_cluster import RedisCluster, running_cluster

_PR_SET_CHILD_SUBREAPER = 36


def pytest_configure(config: pytest.Config) -> None:
    """Adopt orphans: a process whose parent (a demo, a gateway) died without stopping it becomes
    pytest's child, so the check at the end of the session finds it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


# The lanes that need real servers, by folder (and tests elsewhere marked `chaos`); `timing` marks
# the real-clock tests one by one. `-m "not (vllm or chaos or cluster or timing)"` is the rest,
# the lane the suite's time target of 3 minutes is for (issue 30).
_LANES = {"vllm": pytest.mark.vllm, "chaos": pytest.mark.chaos, "cluster": pytest.mark.cluster}


# Before pytest-xdist's own hook, which reads the `xdist_group` marks to keep a group on one worker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(root).parts
        lane = _LANES.get(parts[0]) if len(parts) > 1 else None
        if lane is not None:
            item.add_marker(lane)
        group = _worker_group(item, parts)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # The vLLM tests first: on their one worker they are the longest run of the suite (engines start
    # in minutes), so they start at once while the other workers share out the rest; then the other
    # groups, longest first, so that no worker is left with a long group at the end.
    sizes: dict[str, int] = {}
    for item in items:
        group = _group_of(item)
        if group is not None:
            sizes[group] = sizes.get(group, 0) + 1

    def order(item: pytest.Item) -> tuple[bool, int]:
        group = _group_of(item)
        return item.get_closest_marker("vllm") is None, -sizes[group] if group is not None else 0

    items.sort(key=order)


def _worker_group(item: pytest.Item, parts: tuple[str, ...]) -> str | None:
    """What a test shares with others, so that under pytest-xdist (`--dist loadgroup`) it runs on
    their worker and what they share starts once: the vLLM engines (session fixtures; two sets
    would not fit two cores), the session's Redis Cluster, and a module-scoped fixture (a process,
    a trained model), which would otherwise start once per worker that runs a test of the module."""
    if parts[0] == "vllm" and len(parts) > 1:
        return "vllm"
    callspec = getattr(item, "callspec", None)
    if "redis_cluster" in getattr(item, "fixturenames", ()) or (
        callspec is not None and callspec.params.get("backing") == "cluster"
    ):
        return "redis-cluster"
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for definitions in info.name2fixturedefs.values():
            if definitions and definitions[-1].scope == "module":
                return f"module:{'/'.join(parts)}"
    return None


def _group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No process started by the suite outlives it: a leftover is stopped, named, and fails the run.
    Last of the sessionfinish hooks: pytest's own (which tears down the session fixtures, and with
    them the session's Redis and sims, when a run stops early) comes first."""
    leftover = child_pids(os.getpid())
    if not leftover:
        return
    names = {pid: _command_line(pid) for pid in leftover}
    for pid in leftover:
        os.kill(pid, signal.SIGTERM)
    wait_gone(leftover, timeout_s=10)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "processes that outlived the tests that started them", red=True)
        for pid, name in names.items():
            reporter.write_line(f"{pid}: {name}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(exited)"


@pytest.fixture(scope="session", autouse=True)
def session_redis() -> Iterator[str]:
    """This session's own redis-server on a free loopback port (no persistence), stopped with the
    session: no test uses a Redis on a fixed port, and concurrent sessions (pytest-xdist workers,
    two checkouts) never share one. Its URL is in the environment (`testkit.procs.shared_redis_url`)
    for helpers called outside fixtures and for the processes the tests start."""
    server = start_redis()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(REDIS_URL_ENV, server.url)
            yield server.url
    finally:
        server.kill()


@pytest.fixture(scope="session")
def sim_pair() -> Iterator[list[Announced]]:
    """Two fast simulated backends shared by the tests that do not kill them."""
    sims = [start_sim(), start_sim()]
    try:
        yield sims
    finally:
        for sim in sims:
            sim.stop()


@pytest.fixture
def sims(sim_pair: list[Announced]) -> Iterator[list[Announced]]:
    """The shared sims, healthy: faults a test sets are cleared before and after it, so tests
    that use `sim_pair` directly never meet a leftover fault."""
    for sim in sim_pair:
        reset(sim)
    yield sim_pair
    for sim in sim_pair:
        reset(sim)


@pytest.fixture(scope="module")
def sim() -> Iterator[Announced]:
    """A fast simulated backend of the module's own, for tests that set its faults."""
    process = start_sim()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[Announced]:
    """A simulated backend of the module's own at 10 ms a token: a stream long enough to cut."""
    process = start_sim("--tpot-ms", "10")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def echo_sim() -> Iterator[Announced]:
    """A simulated backend of the module's own that answers a tool result by quoting it, so an
    agent's final answer shows what its tool returned."""
    process = start_sim("--echo-tool-results")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real Redis Cluster on loopback (3 masters, a replica each), started once for the session
    by the first test that asks: the store contract suite and tests/cluster run on it. Tests that
    kill a node start a cluster of their own."""
    with running_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster
