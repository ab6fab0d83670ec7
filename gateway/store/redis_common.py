"""What every part of the Redis store shares: its Lua scripts, and the one translation of a
Redis failure into StoreUnavailable."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import traceback
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from gateway.errors import StoreNotReached, StoreUnavailable
from gateway.store.call_outcomes import CallOutcomes


class ClusterClient(RedisCluster):
    """A Redis Cluster client whose scripts are loaded on every master before they run.

    redis-py's own script object loads a missing script on the first NOSCRIPT reply; done by many
    concurrent calls on a cluster, that broke connections in a cascade (seen with 20 concurrent
    calls on a fresh cluster). Here the scripts are loaded once, under a lock, on every master, and
    again after a NOSCRIPT (a replica promoted by a failover starts with an empty script cache).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gateway_sources: list[str] = []
        self.gateway_loaded = 0  # how many of gateway_sources every master has
        self.gateway_lock = asyncio.Lock()
        # The cluster client fails a call at once when a node's connections are all busy; like
        # the single-node blocking pool, queue bursts instead (for at most `gateway_pool_wait_s`).
        self.gateway_slots = asyncio.Semaphore(int(kwargs.get("max_connections", 32)))
        self.gateway_pool_wait_s = 5.0

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            await asyncio.wait_for(self.gateway_slots.acquire(), self.gateway_pool_wait_s)
        except TimeoutError:
            raise RedisConnectionError("No connection available.") from None
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            self.gateway_slots.release()

    async def load_scripts(self, again: bool = False) -> None:
        async with self.gateway_lock:
            if again:
                self.gateway_loaded = 0
            for source in self.gateway_sources[self.gateway_loaded :]:
                await self.script_load(source)  # every master (redis-py's routing for SCRIPT LOAD)
            self.gateway_loaded = len(self.gateway_sources)


class ClusterScript:
    """A script on a cluster: EVALSHA on the keys' node, the scripts loaded first (see above)."""

    def __init__(self, client: ClusterClient, source: str) -> None:
        self._client = client
        self._sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        client.gateway_sources.append(source)

    async def __call__(self, keys: Sequence[Any], args: Sequence[Any], client: Any = None) -> Any:
        if self._client.gateway_loaded < len(self._client.gateway_sources):
            await self._client.load_scripts()
        try:
            return await self._client.evalsha(self._sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._client.load_scripts(again=True)
            return await self._client.evalsha(self._sha, len(keys), *keys, *args)


# One Redis, or a Redis Cluster: every script and transaction touches a single hash slot, so the
# same calls work on both (keys.py's hash tags); only batching across slots differs.
Client = Redis | ClusterClient
Script = AsyncScript | ClusterScript


def lua(name: str) -> str:
    return resources.files("gateway.store").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def script(client: Client, name: str) -> Script:
    """The Lua script gateway/store/lua/<name>.lua, callable as `await s(keys=..., args=...)`."""
    if isinstance(client, ClusterClient):
        return ClusterScript(client, lua(name))
    # register_script only hashes the source: EVALSHA, loading the script when Redis lacks it.
    return client.register_script(lua(name))


@contextlib.contextmanager
def unavailable(operation: str, outcomes: CallOutcomes) -> Iterator[None]:
    """Redis's failures as StoreUnavailable, every call's outcome counted (for readiness)."""
    try:
        yield
    except (RedisError, RedisClusterException, OSError) as error:
        outcomes.record(failed=True)
        kind = StoreNotReached if _before_sending(error) else StoreUnavailable
        raise kind(f"redis: {operation} failed: {error}") from error
    except (RuntimeError, AttributeError) as error:
        # During a cluster failover redis-py closes a node's connections while other calls are
        # still writing to them, which surfaces as uvloop's RuntimeError ("the handler is closed")
        # or AttributeError ("'NoneType' object has no attribute 'writelines'"): a lost connection
        # like any other (seen as 500s in the failover drill). Only errors raised inside redis-py
        # are translated: the same errors from the gateway's own code are bugs and stay bugs.
        if not _raised_in_redis(error):
            raise
        outcomes.record(failed=True)
        raise StoreUnavailable(f"redis: {operation} failed: connection lost ({error!r})") from error
    outcomes.record(failed=False)


def _raised_in_redis(error: BaseException) -> bool:
    frames = traceback.walk_tb(error.__traceback__)
    return any(frame.f_globals.get("__name__", "").startswith("redis.") for frame, _ in frames)


def _before_sending(error: BaseException) -> bool:
    """redis-py's own words for failing to get a connection at all (pool wait, connect)."""
    text = str(error)
    return text.startswith(("No connection available", "Timeout connecting to")) or " connecting to " in text
