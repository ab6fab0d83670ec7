"""`/admin/`: keys and the audit log over HTTP, with the same rules as the CLI.

Every endpoint authenticates the caller and checks its scope; a lookup by id of another tenant's
object is a 404.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint annotations at runtime,
# and `Caller` below is local to build_admin_router.
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.audit.writer import iterate, verify_store
from gateway.auth.api_keys import KeyService, NewKey, public_view
from gateway.auth.stage import Authenticator
from gateway.core.principal import Limits, Principal, Scope
from gateway.errors import PermissionDenied
from gateway.settings import MAX_LIMIT
from gateway.store.base import AuditStore

_MAX_EXPIRY_S = 100 * 365 * 86400
_MAX_SEQ = 2**53  # audit sequence numbers are counted in Lua numbers (doubles)


class CreateKeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    tenant: str = Field(min_length=1, max_length=200)
    scopes: list[str] = Field(default_factory=lambda: [Scope.CHAT.value])
    models: list[str] = Field(default_factory=list)
    rpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    tpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    daily_tokens: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    expires_in_s: float | None = Field(default=None, gt=0, le=_MAX_EXPIRY_S)


class RevokeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=1000)


def build_admin_router(
    authenticator: Authenticator, keys: KeyService, store: AuditStore, audit_key: bytes
) -> APIRouter:
    router = APIRouter(prefix="/admin")

    async def caller(request: Request) -> Principal:
        return await authenticator.authenticate(request.headers)

    Caller = Annotated[Principal, Depends(caller)]

    @router.post("/keys", status_code=201)
    async def create_key(body: CreateKeyBody, actor: Caller) -> dict[str, Any]:
        issued = await keys.create(
            actor,
            NewKey(
                name=body.name,
                tenant=body.tenant,
                scopes=body.scopes,
                models=body.models,
                limits=Limits(body.rpm, body.tpm, body.max_concurrency, body.daily_tokens),
                expires_at=time.time() + body.expires_in_s if body.expires_in_s else None,
            ),
        )
        return {"key": public_view(issued.record), "secret": issued.secret}

    @router.get("/keys")
    async def list_keys(actor: Caller) -> dict[str, Any]:
        return {"data": [public_view(r) for r in await keys.list(actor)]}

    @router.get("/keys/{key_id}")
    async def show_key(key_id: str, actor: Caller) -> dict[str, Any]:
        return public_view(await keys.get(actor, key_id))

    @router.post("/keys/{key_id}/revoke")
    async def revoke_key(key_id: str, actor: Caller, body: RevokeBody | None = None) -> dict[str, Any]:
        return public_view(await keys.revoke(actor, key_id, body.reason if body else ""))

    @router.post("/keys/{key_id}/rotate")
    async def rotate_key(key_id: str, actor: Caller) -> dict[str, Any]:
        issued = await keys.rotate(actor, key_id)
        return {"key": public_view(issued.record), "secret": issued.secret}

    @router.get("/audit")
    async def query_audit(
        actor: Caller,
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        after_seq: Annotated[int, Query(ge=0, le=_MAX_SEQ)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> dict[str, Any]:
        actor.require(Scope.AUDIT)
        found: list[dict[str, Any]] = []
        async for record in iterate(store, after_seq + 1):
            if _matches(record.body, actor, kind, since, until):
                found.append(record.to_dict())
                if len(found) == limit:
                    break
        return {"data": found, "next_after_seq": found[-1]["seq"] if len(found) == limit else None}

    @router.get("/audit/verify")
    async def verify_audit(actor: Caller) -> dict[str, Any]:
        actor.require(Scope.AUDIT)
        if not actor.all_tenants:
            raise PermissionDenied("verifying the whole chain needs a key that sees every tenant")
        verdict = await verify_store(store, audit_key)
        return {
            "ok": verdict.ok,
            "checked": verdict.checked,
            "first_bad_seq": verdict.first_bad_seq,
            "reason": verdict.reason,
        }

    return router


def _matches(
    record: dict[str, Any], actor: Principal, kind: str | None, since: float | None, until: float | None
) -> bool:
    if not actor.sees_tenant(str(record.get("tenant"))):
        return False
    if kind is not None and record.get("kind") != kind:
        return False
    ts = float(record.get("ts", 0))
    return (since is None or ts >= since) and (until is None or ts < until)
