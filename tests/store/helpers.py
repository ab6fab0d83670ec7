"""Builders shared by the store tests."""

from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid
from typing import Any

from gateway.core.principal import Limits
from gateway.store.approval_record import Approval, ExcerptMessage
from gateway.store.base import AdmitRequest, AdmitResult, AuditHead, AuditRecord, KeyRecord, QuotaScope, Store
from gateway.store.release_record import (
    Canary,
    CanarySettings,
    CheckpointPin,
    EvalSetPin,
    HistoryEntry,
    PromptPin,
    Release,
    SmokePin,
    Thresholds,
)


def key_record(key_id: str, tenant: str = "acme", created_at: float = 1000.0, **changes: Any) -> KeyRecord:
    record = KeyRecord(
        id=key_id,
        name=f"name of {key_id}",
        tenant=tenant,
        digest=hashlib.sha256(key_id.encode()).hexdigest(),
        prefix="agw_abcdefgh",
        scopes=("chat",),
        models=("m1", "m2"),
        limits=Limits(rpm=10, daily_tokens=5000),
        created_at=created_at,
        expires_at=2000.5,
    )
    return dataclasses.replace(record, **changes)


def admit_request(*scopes: QuotaScope, tokens: int = 0, ttl: float = 30.0, tenant: str = "acme") -> AdmitRequest:
    return AdmitRequest(tenant=tenant, scopes=scopes, lease_id=uuid.uuid4().hex, tokens=tokens, lease_ttl_s=ttl)


def key_scope(**limits: int) -> QuotaScope:
    return QuotaScope("key:k1", Limits(**limits))


def tenant_scope(**limits: int) -> QuotaScope:
    return QuotaScope("tenant", Limits(**limits))


def seconds_to_utc_midnight() -> float:
    now = time.time()
    return (now // 86_400 + 1) * 86_400 - now


async def admit_all(store: Store, requests: list[AdmitRequest]) -> list[AdmitResult]:
    return [await store.admit(r) for r in requests]


def chained(head: AuditHead, count: int, writer: str = "w") -> list[AuditRecord]:
    records, prev = [], head.hash
    for seq in range(head.seq + 1, head.seq + 1 + count):
        body = {"seq": seq, "prev": prev, "writer": writer, "detail": {"b": [1, 2], "a": None}}
        prev = hashlib.sha256(repr(body).encode()).hexdigest()
        records.append(AuditRecord.from_dict({**body, "hash": prev}))
    return records


def approval_record(approval_id: str, tenant: str = "acme", requested_at: float = 0.0, **changes: Any) -> Approval:
    """A pending approval as the gateway builds one: requested `requested_at` (default now),
    expiring 60 s later, with text that must round-trip unchanged."""
    requested_at = requested_at or time.time()
    record = Approval(
        id=approval_id,
        tenant=tenant,
        key_id="k1",
        session_id=None,
        call_id="call_1",
        tool="shell.exec",
        arguments='{"cmd": "rm -rf /tmp/x", "n": 0.30000000000000004, "big": 9007199254740993, "u": "日本/é"}',
        arguments_sha256=hashlib.sha256(b"x").hexdigest(),
        reason="matches rule high-risk",
        mode="wait",
        requested_at=requested_at,
        expires_at=requested_at + 60.0,
        status="pending",
        excerpt=(ExcerptMessage("user", "run it"),),
        wait_deadline=requested_at + 30.0,
    )
    return dataclasses.replace(record, **changes)


def release(version: str, model: str = "m1", created_at: float = 1000.0, **changes: Any) -> Release:
    """A release as the gateway builds one, every pin set, with values that must round-trip exactly
    (a float that is not short in binary, an integer beyond 2**53, non-ASCII text)."""
    record = Release(
        model=model,
        version=version,
        deployments=("d1", "d:2"),
        checkpoint=CheckpointPin("ft@1200", "/registry/ft/step-1200", "ab" * 32),
        prompt=PromptPin("p1", "You are é/日本", "cd" * 32),
        eval_set=EvalSetPin("qa", "3", "ef" * 32, "/sets/qa.yaml", '{"cases": [], "big": 9007199254740993}'),
        thresholds=Thresholds(min_pass_rate=0.1 + 0.2),
        smoke=SmokePin("/samples/smoke.jsonl", 10, slo_ttft_ms=250.0, slo_tpot_ms=None, min_goodput=0.95),
        notes="",
        author="alice",
        created_at=created_at,
    )
    return dataclasses.replace(record, **changes)


def entry(by: str = "alice", to: str = "v1", frm: str | None = None) -> HistoryEntry:
    """An activation history entry as given to release_activate (the store sets its generation)."""
    return HistoryEntry("release.promote", frm, to, by, "rollout", at=1234.5)


def canary(version: str = "v2", share: float = 0.05) -> Canary:
    """A stepped canary as the gateway sets one, with values that must round-trip exactly."""
    settings = CanarySettings(share, 0.1 + 0.2, 0.05, 1.5, min_requests=2**53 + 1, steps=(share, 0.25, 1.0))
    return Canary(settings, version, "v1", started_at=1700000000.125, by="é/日本", step=0, step_started_at=1.5)
