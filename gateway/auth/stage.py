"""API keys: secrets, principals, and the authenticator with its per-replica cache.

A secret is `agw_` + 256 random bits (base64url); only its SHA-256 digest is stored, and a record
is found by digest, so the secret itself is never compared. Key records are cached per replica
for `cache_ttl_s` (a revocation reaches every replica within that) and served stale for up to
`stale_ttl_s` while the store is unreachable, so a Redis outage does not log everyone out.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import AsyncGenerator, Callable, Mapping

from gateway.auth.tenancy import ModelTenancy
from gateway.core.chunks import Chunk
from gateway.core.principal import Limits, Principal, Scope
from gateway.errors import AuthenticationFailed, ModelNotFound, StoreUnavailable
from gateway.pipeline import Handler, RequestContext
from gateway.store.base import KeyRecord, KeyStore

SECRET_PREFIX = "agw_"
_SECRET_BYTES = 32
_SECRET_LENGTH = len(SECRET_PREFIX) + len(base64.urlsafe_b64encode(bytes(_SECRET_BYTES)).rstrip(b"="))
BOOTSTRAP_KEY_ID = "bootstrap-admin"


def new_secret() -> str:
    raw = base64.urlsafe_b64encode(secrets.token_bytes(_SECRET_BYTES)).rstrip(b"=").decode()
    return SECRET_PREFIX + raw


_BASE64URL = re.compile(r"^[A-Za-z0-9_-]*$")
KEY_SHAPE = (
    f"'{SECRET_PREFIX}' followed by {_SECRET_LENGTH - len(SECRET_PREFIX)} base64url characters (A-Z a-z 0-9 - _)"
)


def secret_problem(secret: str) -> str | None:
    """What makes `secret` unusable as a key, in words (never echoing it), or None."""
    body = secret.removeprefix(SECRET_PREFIX)
    if not secret.startswith(SECRET_PREFIX):
        return f"it does not start with '{SECRET_PREFIX}'"
    if not _BASE64URL.match(body):
        return "it contains characters other than base64url (A-Z a-z 0-9 - _), or whitespace"
    if len(secret) != _SECRET_LENGTH:
        return f"it has {len(body)} characters after '{SECRET_PREFIX}', not {_SECRET_LENGTH - len(SECRET_PREFIX)}"
    return None


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def principal_of(record: KeyRecord) -> Principal:
    return Principal(
        key_id=record.id,
        tenant=record.tenant,
        scopes=frozenset(record.scopes),
        models=frozenset(record.models),
        limits=record.limits,
        all_tenants=Scope.PLATFORM.value in record.scopes,
    )


def presented_secret(headers: Mapping[str, str]) -> str:
    """The key a request presents: `Authorization: Bearer <key>`, or `x-api-key: <key>` (what the
    Anthropic SDKs send); the Authorization header wins when both are there."""
    header = headers.get("authorization")
    if not header:
        given = headers.get("x-api-key", "").strip()
        if not given:
            raise AuthenticationFailed(
                "Missing API key: send 'Authorization: Bearer agw_...' (or 'x-api-key: agw_...')"
            )
        return _checked(given)
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise AuthenticationFailed("Malformed Authorization header: expected 'Bearer <key>'")
    return _checked(secret)


def _checked(secret: str) -> str:
    if not secret.startswith(SECRET_PREFIX):
        raise AuthenticationFailed(f"Malformed API key: gateway keys start with '{SECRET_PREFIX}'")
    if len(secret) != _SECRET_LENGTH:  # most often a key cut short (or run on) when copied
        raise AuthenticationFailed(
            f"Malformed API key: an '{SECRET_PREFIX}' key has {_SECRET_LENGTH} characters, this one has {len(secret)}"
        )
    return secret


class Authenticator:
    def __init__(
        self,
        store: KeyStore,
        *,
        bootstrap_secret: str,
        cache_ttl_s: float,
        stale_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._bootstrap_digest = digest(bootstrap_secret) if bootstrap_secret else ""
        self._cache_ttl_s = cache_ttl_s
        self._stale_ttl_s = stale_ttl_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._cache: dict[str, tuple[KeyRecord | None, float]] = {}
        # One store lookup per digest at a time: a burst of requests with a key this replica has
        # not cached yet would otherwise send the same query hundreds of times at once.
        self._inflight: dict[str, asyncio.Future[KeyRecord | None]] = {}

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        key_digest = digest(presented_secret(headers))
        if self._bootstrap_digest and hmac.compare_digest(key_digest, self._bootstrap_digest):
            return _bootstrap_principal()
        record = await self._lookup(key_digest)
        if record is None or not hmac.compare_digest(record.digest, key_digest):
            raise AuthenticationFailed("Incorrect API key provided")
        if record.revoked_at is not None:
            raise AuthenticationFailed("This API key has been revoked")
        if record.expires_at is not None and record.expires_at <= self._wall_clock():
            raise AuthenticationFailed("This API key has expired")
        return principal_of(record)

    async def _lookup(self, key_digest: str) -> KeyRecord | None:
        cached = self._cache.get(key_digest)
        now = self._clock()
        if cached is not None and now - cached[1] < self._cache_ttl_s:
            return cached[0]
        try:
            record = await self._fetch_once(key_digest)
        except StoreUnavailable:
            if cached is not None and now - cached[1] < self._stale_ttl_s:
                return cached[0]
            raise
        self._cache[key_digest] = (record, now)
        if len(self._cache) > 100_000:  # bound memory under a flood of random keys
            self._cache.clear()
        return record

    async def _fetch_once(self, key_digest: str) -> KeyRecord | None:
        pending = self._inflight.get(key_digest)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if pending.cancelled():  # the request that was asking went away, not this one
                    return await self._store.find_key(key_digest)
                raise
        future: asyncio.Future[KeyRecord | None] = asyncio.get_running_loop().create_future()
        self._inflight[key_digest] = future
        try:
            record = await self._store.find_key(key_digest)
        except Exception as error:
            future.set_exception(error)
            future.exception()  # marks it retrieved: there may be no waiter to read it
            raise
        except BaseException:
            future.cancel()
            raise
        else:
            future.set_result(record)
            return record
        finally:
            del self._inflight[key_digest]

    def forget(self, key_digest: str) -> None:
        """Drop a cached record at once (this replica revoked or rotated the key)."""
        self._cache.pop(key_digest, None)


def _bootstrap_principal() -> Principal:
    return Principal(
        key_id=BOOTSTRAP_KEY_ID,
        tenant="*",
        scopes=frozenset(s.value for s in Scope),
        models=frozenset(),
        limits=Limits(),
        all_tenants=True,
    )


class Authenticate:
    """The pipeline stage: who is calling, and may they chat. It runs before the body is read,
    so an unauthenticated caller costs a header check and learns nothing about its request."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        principal = await self._authenticator.authenticate(ctx.headers)
        principal.require(Scope.CHAT)
        ctx.principal = principal
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk


class ResolveModel:
    """Unknown models, and models this key may not use, are a 404 before anything is spent.

    404 rather than 403 for a model the key may not use: a key must not learn which models
    other tenants have.
    """

    def __init__(self, tenancy: ModelTenancy) -> None:
        self._tenancy = tenancy

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        known = self._tenancy.known(ctx.model)
        if not known or (ctx.principal is not None and not self._tenancy.may_use(ctx.principal, ctx.model)):
            raise ModelNotFound(f"The model '{ctx.model}' does not exist", param="model")
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk


class ActAs:
    """Stands in for `Authenticate` on a path run for an operator (the preflight's eval cases):
    the operator who asked is the caller, and no secret is presented."""

    def __init__(self, principal: Principal) -> None:
        self._principal = principal

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        ctx.principal = self._principal
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk
