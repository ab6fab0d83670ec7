"""Managing API keys: create, list, show, revoke, rotate. Shared by the admin API and the CLI.

Every change is an audited admin action with its before and after (digests, never secrets).
Lookups by id check the caller's tenant; a key of another tenant is "not found", so ids do not
leak across tenants.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.audit.writer import AuditWriter
from gateway.auth.stage import digest, new_secret
from gateway.auth.tenancy import ModelTenancy
from gateway.core.principal import Limits, Principal, Scope
from gateway.errors import InvalidRequest, NotFound, PermissionDenied
from gateway.store.base import KeyRecord, KeyStore

_DISPLAY_PREFIX = 12  # "agw_" + 8 characters: enough to tell keys apart, useless to an attacker


@dataclass(frozen=True, slots=True)
class NewKey:
    name: str
    tenant: str
    scopes: Sequence[str] = (Scope.CHAT.value,)
    models: Sequence[str] = ()
    limits: Limits = field(default_factory=Limits)
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class IssuedKey:
    record: KeyRecord
    secret: str  # shown once, never stored


def public_view(record: KeyRecord) -> dict[str, Any]:
    view = record.to_dict()
    view.pop("digest")
    return view


class KeyService:
    def __init__(
        self,
        store: KeyStore,
        audit: AuditWriter,
        tenancy: ModelTenancy,
        *,
        on_change: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._audit = audit
        self._tenancy = tenancy
        self._on_change = on_change  # told the digest of a revoked or rotated key
        self._clock = clock

    async def create(self, actor: Principal, new: NewKey) -> IssuedKey:
        actor.require(Scope.ADMIN)
        if not actor.sees_tenant(new.tenant):
            raise NotFound(f"tenant '{new.tenant}' not found")
        unknown = sorted(set(new.scopes) - {s.value for s in Scope})
        if unknown:
            raise InvalidRequest(f"unknown scopes: {', '.join(unknown)}", param="scopes")
        if not new.name or not new.tenant:
            raise InvalidRequest("a key needs a name and a tenant", param="name" if not new.name else "tenant")
        # What the new key leaves open it inherits from its creator: a narrow admin's keys are as narrow.
        new = dataclasses.replace(
            new, models=new.models or tuple(sorted(actor.models)), limits=_inherit(new.limits, actor.limits)
        )
        _require_within(actor, new.scopes, new.models, new.limits)
        self._require_served(new.tenant, new.models)
        secret = new_secret()
        record = KeyRecord(
            id=f"key_{secrets.token_hex(8)}",
            name=new.name,
            tenant=new.tenant,
            digest=digest(secret),
            prefix=secret[:_DISPLAY_PREFIX],
            scopes=tuple(dict.fromkeys(new.scopes)),
            models=tuple(dict.fromkeys(new.models)),
            limits=new.limits,
            created_at=self._clock(),
            expires_at=new.expires_at,
        )
        await self._store.put_key(record)
        await self._record(actor, "key.create", record, None, public_view(record))
        return IssuedKey(record, secret)

    def _require_served(self, tenant: str, models: Sequence[str]) -> None:
        """Every model a key names must be one its tenant may use: another tenant's model (or one
        the config does not have) would answer it 404 forever. The same words for both, so a
        tenant admin cannot tell another tenant's model from no model."""
        for model in models:
            if not self._tenancy.serves(tenant, model):
                raise InvalidRequest(
                    f"The model '{model}' does not exist for tenant '{tenant}'; a key cannot name it",
                    param="models",
                    code="model_not_found",
                )

    async def list(self, actor: Principal) -> list[KeyRecord]:
        actor.require(Scope.ADMIN)
        return await self._store.list_keys(None if actor.all_tenants else actor.tenant)

    async def get(self, actor: Principal, key_id: str) -> KeyRecord:
        actor.require(Scope.ADMIN)
        record = await self._store.get_key(key_id)
        if record is None or not actor.sees_tenant(record.tenant):
            raise NotFound(f"key '{key_id}' not found")
        return record

    async def revoke(self, actor: Principal, key_id: str, reason: str = "") -> KeyRecord:
        before = await self._manageable(actor, key_id)
        if before.revoked_at is not None:
            return before  # idempotent: revoking twice changes nothing and records nothing
        after = dataclasses.replace(before, revoked_at=self._clock())
        await self._store.put_key(after)
        self._changed(before.digest)
        await self._record(actor, "key.revoke", after, public_view(before), public_view(after), reason)
        return after

    async def rotate(self, actor: Principal, key_id: str) -> IssuedKey:
        """A new secret for the same key id, limits and scopes; the old secret stops working."""
        before = await self._manageable(actor, key_id)
        if before.revoked_at is not None:
            raise InvalidRequest(f"key '{key_id}' is revoked; create a new one", param="key_id")
        secret = new_secret()
        after = dataclasses.replace(before, digest=digest(secret), prefix=secret[:_DISPLAY_PREFIX])
        await self._store.put_key(after)
        self._changed(before.digest)
        await self._record(actor, "key.rotate", after, public_view(before), public_view(after))
        return IssuedKey(after, secret)

    async def _manageable(self, actor: Principal, key_id: str) -> KeyRecord:
        """A key the actor may revoke or rotate: rotating hands out its secret, so never a wider one."""
        record = await self.get(actor, key_id)
        _require_within(actor, record.scopes, record.models, record.limits)
        return record

    def _changed(self, old_digest: str) -> None:
        if self._on_change is not None:
            self._on_change(old_digest)

    async def _record(
        self,
        actor: Principal,
        action: str,
        target: KeyRecord,
        before: dict[str, Any] | None,
        after: dict[str, Any],
        reason: str = "",
    ) -> None:
        await self._audit.submit(
            {
                "kind": "admin",
                "action": action,
                "actor": actor.key_id,
                "tenant": target.tenant,
                "target": target.id,
                "before": before,
                "after": after,
                "reason": reason,
            }
        )


_LIMIT_NAMES = ("rpm", "tpm", "max_concurrency", "daily_tokens")


def _inherit(asked: Limits, actor: Limits) -> Limits:
    return Limits(
        **{
            name: getattr(asked, name) if getattr(asked, name) is not None else getattr(actor, name)
            for name in _LIMIT_NAMES
        }
    )


def _require_within(actor: Principal, scopes: Sequence[str], models: Sequence[str], limits: Limits) -> None:
    """A key never grants more than the key acting on it holds: scopes, models and every limit."""
    wider = sorted(set(scopes) - actor.scopes)
    if wider:
        raise PermissionDenied(f"this key cannot grant scopes it does not hold: {', '.join(wider)}")
    if actor.models and (not models or not set(models) <= actor.models):
        raise PermissionDenied(f"this key can only grant its own models: {', '.join(sorted(actor.models))}")
    for name in _LIMIT_NAMES:
        own, asked = getattr(actor.limits, name), getattr(limits, name)
        if own is not None and (asked is None or asked > own):
            raise PermissionDenied(f"this key can only grant {name} up to its own {own}")
