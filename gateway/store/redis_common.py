"""What every part of the Redis store shares: its Lua scripts, and the one translation of a
Redis failure into StoreUnavailable."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import resources

from redis.exceptions import RedisError

from gateway.errors import StoreUnavailable


def lua(name: str) -> str:
    return resources.files("gateway.store").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


@contextlib.contextmanager
def unavailable(operation: str) -> Iterator[None]:
    try:
        yield
    except (RedisError, OSError) as error:
        raise StoreUnavailable(f"redis: {operation} failed: {error}") from error
