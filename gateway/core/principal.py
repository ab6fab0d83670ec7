"""Who is calling: the principal that travels with a request, its limits, and the scopes a key can hold.

In the kernel because nearly every layer reads it (the stages, the store's quota scopes, the
admin surfaces) and it depends on nothing but the error tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.errors import PermissionDenied


class Scope(StrEnum):
    CHAT = "chat"  # use models
    ADMIN = "admin"  # manage keys and releases
    APPROVER = "approver"  # decide tool approvals
    AUDIT = "audit"  # read the audit log
    PLATFORM = "platform"  # every tenant: shared models' releases, the policy file, the whole audit chain


@dataclass(frozen=True, slots=True)
class Limits:
    """None means unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None
    daily_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: travels with the request; every tenant-owned lookup checks `tenant`."""

    key_id: str
    tenant: str
    scopes: frozenset[str]
    models: frozenset[str]  # empty: every model
    limits: Limits
    all_tenants: bool = False  # a platform admin: the bootstrap key, the CLI operator, a `platform` key

    def require(self, scope: Scope) -> None:
        if scope.value not in self.scopes:
            raise PermissionDenied(f"this key lacks the '{scope.value}' scope")

    def may_use(self, model: str) -> bool:
        return not self.models or model in self.models

    def sees_tenant(self, tenant: str) -> bool:
        return self.all_tenants or tenant == self.tenant
