"""Model releases in Redis: every key under the one tag `releases` (see gateway/store/keys.py),
every call one command, one MULTI or one script. Records and history entries are kept byte for
byte as encoded here: no script re-encodes JSON (cjson would round floats and turn [] into {}).
"""

from __future__ import annotations

from gateway.store import keys
from gateway.store import release_record as releases
from gateway.store.call_outcomes import CallOutcomes
from gateway.store.fields import stored
from gateway.store.redis_common import Client, script, unavailable
from gateway.store.release_record import Canary, HistoryEntry, Release


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class RedisReleases:
    def __init__(self, redis: Client, prefix: str, outcomes: CallOutcomes) -> None:
        self._outcomes = outcomes
        self._redis = redis
        self._prefix = prefix
        self._keys = keys.release_keys(prefix)
        self._put = script(redis, "release_put")
        self._list = script(redis, "release_list")
        self._activate = script(redis, "release_activate")
        self._set_canary = script(redis, "release_set_canary")

    async def put(self, record: Release) -> bool:
        new = releases.check_put(record)
        names = [self._keys.records, keys.release_versions(self._prefix, new.model)]
        args: list[str | bytes] = [
            keys.release_member(new.model, new.version),
            new.blob,
            new.version,
            repr(new.created_at),
        ]
        with unavailable("release_put", self._outcomes):
            return bool(await self._put(keys=names, args=args))

    async def get(self, model: str, version: str) -> Release | None:
        with unavailable("release_get", self._outcomes):
            raw = await self._redis.hget(self._keys.records, keys.release_member(model, version))
        if raw is None:
            return None
        with stored("release", f"{model}@{version}"):
            return Release.from_json(raw)

    async def list_releases(self, model: str) -> list[Release]:
        names = [self._keys.records, keys.release_versions(self._prefix, model)]
        # The member of (model, version) is the model's part, a colon, then the encoded version.
        member_prefix = keys.release_member(model, "")
        with unavailable("release_list", self._outcomes):
            raw = await self._list(keys=names, args=[member_prefix])
        # The script answers records only: a malformed one is named by its model.
        with stored("release list", model):
            return [Release.from_json(record) for record in raw]

    async def active(self, model: str) -> tuple[str | None, int]:
        with unavailable("release_active", self._outcomes):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(self._keys.active, model)
                pipe.hget(self._keys.generations, model)
                version, generation = await pipe.execute()
        return (None if version is None else _text(version)), int(generation or 0)

    async def activate(
        self, model: str, version: str, expected_generation: int, entry: HistoryEntry
    ) -> tuple[bool, int]:
        blob = releases.check_activation(model, version, expected_generation, entry)
        names = [
            self._keys.records,
            self._keys.active,
            self._keys.generations,
            keys.release_history(self._prefix, model),
            self._keys.canaries,
        ]
        args: list[str | int | bytes] = [
            model,
            keys.release_member(model, version),
            version,
            expected_generation,
            blob,
            releases.HISTORY_CAP,
        ]
        with unavailable("release_activate", self._outcomes):
            won, generation = await self._activate(keys=names, args=args)
        return bool(won), int(generation)

    async def history(self, model: str, limit: int) -> list[HistoryEntry]:
        if limit <= 0:
            return []
        with unavailable("release_history", self._outcomes):
            raw = await self._redis.lrange(keys.release_history(self._prefix, model), 0, limit - 1)
        with stored("activation history", model):
            return [HistoryEntry.from_json(entry) for entry in raw]

    async def generations(self) -> dict[str, int]:
        with unavailable("release_generations", self._outcomes):
            raw = await self._redis.hgetall(self._keys.generations)
        return {_text(model): int(generation) for model, generation in raw.items()}

    async def canary(self, model: str) -> Canary | None:
        with unavailable("release_canary", self._outcomes):
            raw = await self._redis.hget(self._keys.canaries, model)
        if raw is None:
            return None
        with stored("canary", model):
            return Canary.from_json(raw)

    async def set_canary(self, model: str, canary: Canary | None, expected_generation: int) -> tuple[bool, int]:
        blob = releases.check_canary(model, canary, expected_generation)
        names = [self._keys.generations, self._keys.canaries]
        args: list[str | int | bytes] = [model, expected_generation, "0" if blob is None else "1", blob or b""]
        with unavailable("release_set_canary", self._outcomes):
            won, generation = await self._set_canary(keys=names, args=args)
        return bool(won), int(generation)
