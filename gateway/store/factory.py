"""The one place that chooses a store implementation from the settings."""

from __future__ import annotations

from gateway.settings import EmbeddedStoreSettings, RedisStoreSettings
from gateway.store.base import Store


def open_store(settings: EmbeddedStoreSettings | RedisStoreSettings) -> Store:
    """Build the configured store; it connects on first use, so this never blocks or fails."""
    # Imported here so that an embedded deployment never loads redis, and the reverse.
    if isinstance(settings, RedisStoreSettings):
        from gateway.store.redis_store import RedisStore

        return RedisStore(settings)
    from gateway.store.embedded import EmbeddedStore

    return EmbeddedStore(settings)
