"""Builders shared by the store tests."""

from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid
from typing import Any

from gateway.store.approval_record import Approval, ExcerptMessage
from gateway.store.base import AdmitRequest, AdmitResult, AuditHead, AuditRecord, KeyRecord, Limits, QuotaScope, Store


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
