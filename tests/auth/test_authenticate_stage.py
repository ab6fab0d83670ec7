"""The authentication stage on its own, over the embedded store: who may call, what a refusal
says, and how long a revocation or a store outage takes to reach a replica's cache."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from gateway.auth.stage import Authenticate, Authenticator, digest, new_secret
from gateway.core.chunks import Chunk
from gateway.core.principal import Limits
from gateway.errors import AuthenticationFailed, PermissionDenied, StoreUnavailable
from gateway.pipeline import RequestContext
from gateway.settings import EmbeddedStoreSettings
from gateway.store.base import KeyRecord
from gateway.store.embedded import EmbeddedStore
from gateway.surfaces.chat_completions import ChatCompletions

CACHE_TTL_S, STALE_TTL_S = 5.0, 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    yield store
    await store.aclose()


async def put_key(store: EmbeddedStore, scopes: tuple[str, ...] = ("chat",), **fields: float) -> tuple[str, KeyRecord]:
    secret = new_secret()
    record = KeyRecord(
        id=f"key_{secret[-6:]}",
        name="agent",
        tenant="acme",
        digest=digest(secret),
        prefix=secret[:8],
        scopes=scopes,
        models=(),
        limits=Limits(),
        created_at=0.0,
        **fields,
    )
    await store.put_key(record)
    return secret, record


def request_with(secret: str | None) -> RequestContext:
    headers = {} if secret is None else {"authorization": f"Bearer {secret}"}
    return RequestContext("r1", "c1", ChatCompletions(), headers=headers)


async def answered(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
    yield Chunk(content="ok")


def stage_over(store: EmbeddedStore, clock: Clock, wall_clock: Clock | None = None) -> Authenticate:
    authenticator = Authenticator(
        store,
        bootstrap_secret="",
        cache_ttl_s=CACHE_TTL_S,
        stale_ttl_s=STALE_TTL_S,
        clock=clock,
        wall_clock=wall_clock or Clock(),
    )
    return Authenticate(authenticator)


async def run(stage: Authenticate, ctx: RequestContext) -> list[str | None]:
    return [chunk.content async for chunk in stage(ctx, answered)]


async def test_a_valid_key_is_the_requests_principal(store: EmbeddedStore) -> None:
    secret, record = await put_key(store)
    ctx = request_with(secret)
    assert await run(stage_over(store, Clock()), ctx) == ["ok"]
    assert ctx.principal is not None
    assert (ctx.principal.key_id, ctx.principal.tenant) == (record.id, "acme")


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "Missing API key"),
        ("Basic abc", "Malformed Authorization header"),
        ("Bearer sk-not-ours", "gateway keys start with 'agw_'"),
        ("Bearer agw_short", "this one has 9"),
    ],
)
async def test_a_missing_or_malformed_key_is_refused_before_the_store_is_asked(
    store: EmbeddedStore, header: str | None, says: str
) -> None:
    ctx = RequestContext("r1", "c1", ChatCompletions(), headers={} if header is None else {"authorization": header})
    await store.aclose()  # a lookup would fail with StoreUnavailable, not with the refusal
    with pytest.raises(AuthenticationFailed, match=says):
        await run(stage_over(store, Clock()), ctx)
    assert ctx.principal is None


async def test_an_unknown_key_is_refused_with_401(store: EmbeddedStore) -> None:
    with pytest.raises(AuthenticationFailed, match="Incorrect API key") as refused:
        await run(stage_over(store, Clock()), request_with(new_secret()))
    assert refused.value.status == 401


async def test_a_key_without_the_chat_scope_is_refused_with_403(store: EmbeddedStore) -> None:
    secret, _ = await put_key(store, scopes=("admin",))
    with pytest.raises(PermissionDenied) as refused:
        await run(stage_over(store, Clock()), request_with(secret))
    assert refused.value.status == 403


async def test_an_expired_key_is_refused_from_the_moment_it_expires(store: EmbeddedStore) -> None:
    secret, _ = await put_key(store, expires_at=2000.0)
    wall = Clock()
    stage = stage_over(store, Clock(), wall)
    wall.now = 1999.0
    assert await run(stage, request_with(secret)) == ["ok"]
    wall.now = 2000.0
    with pytest.raises(AuthenticationFailed, match="expired"):
        await run(stage, request_with(secret))


async def test_a_revocation_reaches_the_cache_within_its_ttl(store: EmbeddedStore) -> None:
    secret, record = await put_key(store)
    clock = Clock()
    stage = stage_over(store, clock)
    assert await run(stage, request_with(secret)) == ["ok"]
    await store.put_key(KeyRecord(**{**record.to_dict(), "limits": record.limits, "revoked_at": 1.0}))
    clock.now += CACHE_TTL_S - 0.1
    assert await run(stage, request_with(secret)) == ["ok"], "cached: the store is not asked yet"
    clock.now += 0.2
    with pytest.raises(AuthenticationFailed, match="revoked"):
        await run(stage, request_with(secret))


async def test_a_store_outage_serves_a_known_key_from_the_cache_until_the_stale_ttl(store: EmbeddedStore) -> None:
    secret, _ = await put_key(store)
    clock = Clock()
    stage = stage_over(store, clock)
    assert await run(stage, request_with(secret)) == ["ok"]
    await store.aclose()
    clock.now += STALE_TTL_S - 1
    assert await run(stage, request_with(secret)) == ["ok"]
    clock.now += 2
    with pytest.raises(StoreUnavailable):
        await run(stage, request_with(secret))
