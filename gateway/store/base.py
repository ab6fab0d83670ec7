"""The storage seam: everything the gateway keeps outside one request lives behind `Store`.

Two implementations honour one contract (tests/store/test_contract.py runs against both):
`EmbeddedStore` (SQLite file + in-process counters; one replica, nothing else to run) and
`RedisStore` (several replicas; every multi-key operation is one Lua script on one hash slot).

The store owns the clock for quota windows, so that replicas with skewed clocks still share
exact windows. Failures to reach the backing service raise `StoreUnavailable`; nothing else
escapes an implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.core.principal import Limits
from gateway.store.approval_record import Approval, Decision, PendingCaps
from gateway.store.audit_batch import AuditHead as AuditHead  # re-exported: every consumer imports it from here
from gateway.store.audit_batch import AuditRecord as AuditRecord
from gateway.store.key_record import KeyRecord as KeyRecord  # re-exported, as above
from gateway.store.release_record import Canary, HistoryEntry, Release
from gateway.store.session_record import SessionState

WINDOW_S = 60  # RPM and TPM are counted over a sliding window of this many one-second buckets


@dataclass(frozen=True, slots=True)
class QuotaScope:
    """One set of counters: `"key:<id>"` or `"tenant"` (the tenant's own counters)."""

    name: str
    limits: Limits


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    tenant: str
    scopes: tuple[QuotaScope, ...]
    lease_id: str
    tokens: int  # reserved now, reconciled by `settle`
    lease_ttl_s: float  # a concurrency slot not renewed within this is freed (dead replica)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What `admit` took, and when by the store's clock; `settle` needs it back."""

    lease_id: str
    tokens: int
    second: int  # the TPM bucket the tokens were counted in
    day: int  # the daily-budget counter they were counted in (days since the epoch, UTC)


@dataclass(frozen=True, slots=True)
class ScopeUsage:
    """Counters of one scope after the decision, for `x-ratelimit-*` headers."""

    requests_remaining: int | None = None
    requests_reset_s: float = 0.0
    tokens_remaining: int | None = None
    tokens_reset_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AdmitResult:
    admitted: bool
    reservation: Reservation | None = None
    denied_scope: str | None = None
    denied_limit: str | None = None  # "rpm" | "tpm" | "max_concurrency" | "daily_tokens"
    retry_after_s: float = 0.0
    usage: dict[str, ScopeUsage] = field(default_factory=dict)  # by scope name


@dataclass(frozen=True, slots=True)
class SessionCheckpoint:
    """One session's share of a batched checkpoint (see `Store.session_checkpoint`)."""

    tenant: str
    session_id: str
    ttl_s: float
    state: SessionState | None = None  # saved when given
    events: list[tuple[int, bytes]] = field(default_factory=list)  # appended, as session_append
    renew_owner: str | None = None  # claim or extend the lease for this owner (lease_ttl_s)
    lease_ttl_s: float = 0.0
    release_owner: str | None = None  # drop the lease if this owner holds it
    replace_events: bool = False  # a new response: drop the previous response's events first
    # The gateway made the id a moment ago: no row can hold it yet, so a store may open it with
    # one insert (embedded: one statement, not five). A store that cannot tell still opens it.
    new: bool = False


class KeyStore(Protocol):
    """API key records (gateway/auth/api_keys.py, auth/stage.py)."""

    async def put_key(self, record: KeyRecord) -> None:
        """Insert or replace a key record (and its digest index)."""
        ...

    async def get_key(self, key_id: str) -> KeyRecord | None: ...

    async def find_key(self, digest: str) -> KeyRecord | None:
        """The key whose secret hashes to `digest`."""
        ...

    async def list_keys(self, tenant: str | None) -> list[KeyRecord]:
        """Keys of one tenant, or of every tenant when `tenant` is None; sorted by creation."""
        ...


class QuotaStore(Protocol):
    """Quota windows and concurrency leases (gateway/quota/stage.py)."""

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        """Check and take, atomically and for every scope at once: one request of the RPM
        window, `tokens` of the TPM window and of the daily budget, one concurrency lease.
        Either everything is taken or nothing is."""
        ...

    async def settle(
        self, tenant: str, scopes: tuple[QuotaScope, ...], reservation: Reservation, used_tokens: int
    ) -> None:
        """Free the concurrency lease and replace the reserved tokens with `used_tokens`."""
        ...

    async def renew_lease(self, tenant: str, scopes: tuple[QuotaScope, ...], lease_id: str, ttl_s: float) -> None:
        """Keep a long request's concurrency lease alive."""
        ...


class AuditStore(Protocol):
    """The hash-chained audit log (gateway/audit/writer.py)."""

    async def audit_head(self) -> AuditHead: ...

    async def audit_append(self, expected: AuditHead, records: list[AuditRecord]) -> bool:
        """Append already-chained records if the chain still ends at `expected`; else append
        nothing and return False (another writer got there first: re-chain and retry).
        Record i must carry `seq == expected.seq + 1 + i`."""
        ...

    async def audit_range(self, first_seq: int, limit: int) -> list[AuditRecord]:
        """Records with seq >= first_seq, in chain order, at most `limit`."""
        ...

    async def audit_trim(self, before_seq: int, anchor: AuditHead) -> None:
        """Drop records with seq < before_seq (they have been archived); remember `anchor`, the
        last dropped record, so the rest of the chain still verifies."""
        ...

    async def audit_anchor(self) -> AuditHead:
        """The last record trimmed away (0 and "" if none): where verification starts."""
        ...


class SessionStore(Protocol):
    """Resumable stream checkpoints (gateway/sessions/)."""

    # A session is the checkpoint of a streamed response: a `SessionState`, an append-only log of
    # SSE events numbered from 1, and a lease naming the replica that owns the live stream.
    # Everything is per tenant: another tenant's session id simply does not exist. State and
    # events expire together; the lease expires on its own (saving or appending may shorten it
    # to the session's expiry, never lengthen it). Seqs must be >= 1 and TTLs > 0 (ValueError).
    async def session_save(self, tenant: str, session_id: str, state: SessionState, ttl_s: float) -> None:
        """Create or replace the session's state (stored as its JSON) and refresh the TTL of the
        whole session (state, events, lease) to `ttl_s` from now."""
        ...

    async def session_load(self, tenant: str, session_id: str) -> SessionState | None:
        """The state last saved, or None (never saved, deleted, or expired). Events appended to
        a session never saved do not make it loadable: its state stays None until saved."""
        ...

    async def session_append(self, tenant: str, session_id: str, events: list[tuple[int, bytes]], ttl_s: float) -> None:
        """Append (seq, payload) events in increasing seq order. Events whose seq is not above the
        highest stored seq are skipped (a retried flush must not duplicate). Refreshes the TTL.
        Appending to an expired session starts a new log (seqs from 1 again)."""
        ...

    async def session_events(self, tenant: str, session_id: str, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Stored events with seq > after_seq, in order, at most `limit`."""
        ...

    async def session_claim(self, tenant: str, session_id: str, owner: str, ttl_s: float) -> bool:
        """Take or renew the live-stream lease: succeeds (and sets it to expire ttl_s from now)
        when nobody holds it, the holder's lease expired, or `owner` already holds it."""
        ...

    async def session_release(self, tenant: str, session_id: str, owner: str) -> None:
        """Drop the lease if `owner` holds it (a finished stream)."""
        ...

    async def session_open(self, first: SessionCheckpoint) -> bool:
        """A new stream's first checkpoint: claim the lease for `first.renew_owner` (required) and,
        only if that succeeds, write the rest of `first`, as one transaction where the store has
        them (SQLite); False, and nothing written, when another owner holds a live lease."""
        ...

    async def session_checkpoint(self, items: list[SessionCheckpoint]) -> None:
        """Several sessions' saves, appends and lease changes in one round trip (Redis) or one
        transaction (SQLite): the checkpointer writes every live session at once."""
        ...

    async def session_delete(self, tenant: str, session_id: str) -> bool:
        """Remove state, events and lease; True if the session existed (any of them was live)."""
        ...


class ApprovalStore(Protocol):
    """Human approvals of tool calls (gateway/approvals/service.py)."""

    # An approval is a human's decision on a high-risk tool call: an `Approval` the gateway
    # builds (status "pending" | "approved" | "rejected" | "expired", requested_at and expires_at
    # in unix seconds), kept as its JSON and read back field for field. Namespaced by tenant:
    # another tenant's id does not exist. Expiry is judged by the store's clock. Bad arguments
    # raise ValueError before anything is touched (approval_record.py has the checks and types).
    async def approval_put(self, record: Approval, ttl_s: float) -> None:
        """Create an approval; its status must be "pending". Kept for ttl_s (> 0) after its
        expires_at (for the audit trail and for clients asking about it), then forgotten. An
        approval with the same tenant and id that still exists is left as it is: a retried put
        cannot reset a decided approval."""
        ...

    async def approval_put_within(self, record: Approval, ttl_s: float, caps: PendingCaps) -> str | None:
        """`approval_put`, unless the record's key already has `caps.per_key` approvals pending
        (as read: undecided and not lapsed), or its tenant `caps.per_tenant`: then nothing is
        stored and the answer names the cap reached, "key" (checked first) or "tenant". None when
        stored, or when a live approval with the same tenant and id was left as it is (a retried
        put). Atomic: however many puts race, from any number of replicas, none passes a cap."""
        ...

    async def approval_get(self, tenant: str, approval_id: str) -> Approval | None:
        """The record (with its decision merged in, once decided); a pending one whose
        expires_at has passed reads as status "expired". None if unknown or forgotten."""
        ...

    async def approval_decide(self, tenant: str, approval_id: str, decision: Decision) -> tuple[bool, Approval | None]:
        """Atomically: if the approval exists, is pending and has not expired, merge `decision`
        into it (its set fields win; its status must be "approved", "rejected" or "expired" - the
        gateway expires one whose wait ended) and return (True, the updated record).
        Otherwise change nothing and return (False, the current record or None). Of concurrent
        decisions, from any number of replicas, exactly one wins."""
        ...

    async def approval_redeem(self, tenant: str, approval_id: str) -> bool:
        """Atomically mark the approval's answer as collected: True the first time for a live
        approval, False after that (from any replica) and for an unknown or forgotten one. The mark
        is forgotten with the approval."""
        ...

    async def approval_list(self, tenant: str | None, status: str | None, limit: int) -> list[Approval]:
        """At most `limit` approvals, newest (requested_at) first, of one tenant or of every
        tenant (None). `status` (None: any) filters on the status as read: a lapsed pending
        approval lists as "expired" (and not as "pending")."""
        ...


class ReleaseStore(Protocol):
    """Model releases, their active pointers and canaries (gateway/releases/)."""

    # A release is an immutable `Release` the gateway builds (`model` and `version` non-empty,
    # `created_at` in unix seconds), kept as its JSON and read back field for field. Each model has
    # an active pointer: the active version and a generation, 0 before the first activation and one
    # more at each, so that replicas notice a switch by comparing numbers. Bad arguments raise
    # ValueError before anything is touched (release_record.py has the checks and types).
    async def release_put(self, record: Release) -> bool:
        """Create release (model, version); False (and nothing changed) if that version exists:
        releases are immutable."""
        ...

    async def release_get(self, model: str, version: str) -> Release | None: ...

    async def release_list(self, model: str) -> list[Release]:
        """Every release of the model, oldest first (by created_at, then version)."""
        ...

    async def release_active(self, model: str) -> tuple[str | None, int]:
        """(active version or None, generation); generation is 0 before any activation."""
        ...

    async def release_activate(
        self, model: str, version: str, expected_generation: int, entry: HistoryEntry
    ) -> tuple[bool, int]:
        """Atomically: if the model's generation still equals expected_generation and the release
        exists, make `version` active, bump the generation, and append `entry` (with the new
        generation in place of its own) to the model's activation history; return (True, new
        generation). Otherwise change nothing and return (False, current generation). Concurrent
        activations: exactly one wins.
        The history keeps the newest release_record.HISTORY_CAP entries per model."""
        ...

    async def release_history(self, model: str, limit: int) -> list[HistoryEntry]:
        """Activation history entries, newest first, at most `limit` (each as given, with the
        generation it produced)."""
        ...

    async def release_generations(self) -> dict[str, int]:
        """Every model's current generation (activated, or with a canary set at some point), in
        one call: replicas poll this to notice a switch or a canary change."""
        ...

    # Each model has one canary slot, shared by replicas: a `Canary` (candidate, share, window,
    # thresholds, steps...) kept as its JSON, byte for byte as set. Setting or clearing it bumps the same
    # generation release_activate does, and release_activate clears it (promoting or rolling back
    # ends a canary).
    async def release_canary(self, model: str) -> Canary | None:
        """The model's running canary (as set), or None."""
        ...

    async def release_set_canary(self, model: str, canary: Canary | None, expected_generation: int) -> tuple[bool, int]:
        """Atomically: if the model's generation (the same counter release_activate uses) equals
        expected_generation, set (or, with None, clear) the canary and bump the generation so that
        replicas polling release_generations() notice; return (True, new generation). Otherwise
        change nothing and return (False, current generation). Allowed before any activation
        (generation 0 -> 1; release_active then still reports no active version)."""
        ...


class LifecycleStore(Protocol):
    """Whether the store is there, and still the same store."""

    async def store_epoch(self, candidate: str) -> str:
        """The store's epoch: set to `candidate` if the store has none yet (a new, or wiped, store),
        and returned as stored. It never changes otherwise, so a replica that sees a different
        epoch than at its start knows the store lost everything in between."""
        ...

    async def ping(self) -> None:
        """Raise StoreUnavailable if the backing service cannot be reached."""
        ...

    def failing(self) -> str | None:
        """Why the calls live traffic made lately say the store is failing, or None (readiness:
        a probe answers for the one place it reads, see store/call_outcomes.py)."""
        ...

    async def aclose(self) -> None: ...


class Store(KeyStore, QuotaStore, AuditStore, SessionStore, ApprovalStore, ReleaseStore, LifecycleStore, Protocol):
    """Every domain at once: what `open_store` builds and the composition root hands out. Consumers
    take the one domain protocol they use, so a service's signature says what it may touch."""
