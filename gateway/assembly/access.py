"""Who may call and how much: API keys and their authenticator, model tenancy, the quota, and
the stages that trace, audit and authenticate every request; the admin API for keys and audit."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gateway.assembly.foundation import Foundation
from gateway.assembly.lifecycle import Part, closed_at_exit, started
from gateway.audit.stage import AuditRequests, RefusalTally
from gateway.auth.api_keys import KeyService
from gateway.auth.stage import Authenticate, Authenticator, ResolveModel
from gateway.auth.tenancy import ModelTenancy
from gateway.http.admin_api import build_admin_router
from gateway.quota.admission import RetryDiscipline
from gateway.quota.stage import Admit
from gateway.settings import Settings
from gateway.store.base import Store
from gateway.telemetry.stage import TraceRequests


def build_authenticator(settings: Settings, store: Store) -> Authenticator:
    return Authenticator(
        store,
        bootstrap_secret=settings.auth.admin_key or os.environ.get("GATEWAY_ADMIN_KEY", ""),
        cache_ttl_s=settings.auth.cache_ttl_s,
        stale_ttl_s=settings.auth.stale_ttl_s,
    )


@dataclass(frozen=True, slots=True)
class Access:
    authenticator: Authenticator
    tenancy: ModelTenancy
    quota: Admit
    trace_requests: TraceRequests
    audit_requests: AuditRequests
    authenticate: Authenticate
    retry_discipline: RetryDiscipline
    resolve_model: ResolveModel
    part: Part


def build_access(settings: Settings, base: Foundation) -> Access:
    authenticator = build_authenticator(settings, base.store)
    quota = Admit(base.store, settings.quota)
    refusals = RefusalTally(
        base.audit, interval_s=settings.audit.refusal_interval_s, max_sources=settings.audit.refusal_max_sources
    )
    tenancy = ModelTenancy({m.name: m.tenants for m in settings.models})
    keys = KeyService(base.store, base.audit, tenancy, on_change=authenticator.forget)
    base.telemetry.watch(base.router, quota)
    admin = build_admin_router(authenticator, keys, base.store, settings.audit.hmac_key.encode())
    return Access(
        authenticator=authenticator,
        tenancy=tenancy,
        quota=quota,
        trace_requests=TraceRequests(base.telemetry, [m.name for m in settings.models]),
        audit_requests=AuditRequests(base.audit, capture=settings.audit.capture, refusals=refusals),
        authenticate=Authenticate(authenticator),
        retry_discipline=RetryDiscipline(settings.quota.refuse_early_retries),
        resolve_model=ResolveModel(tenancy),
        part=Part(
            routers=(admin,),
            running=(started(refusals.start, refusals.stop), closed_at_exit(quota.drain)),
        ),
    )
