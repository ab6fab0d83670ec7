"""Every Redis key name and time-to-live the Redis store uses.

Names carry Redis Cluster hash tags so that each Lua script touches a single slot:

    <prefix>:{t:<tenant>}:requests:<scope>   hash  unix second -> requests admitted in it
    <prefix>:{t:<tenant>}:tokens:<scope>     hash  unix second -> tokens counted in it
    <prefix>:{t:<tenant>}:daily:<scope>      hash  UTC day number -> tokens counted that day
    <prefix>:{t:<tenant>}:leases:<scope>     zset  lease id scored by its expiry (unix time)
    <prefix>:{keys}:records                  hash  key id -> KeyRecord JSON
    <prefix>:{keys}:digests                  hash  secret digest -> key id
    <prefix>:{keys}:tenant:<tenant>          set   ids of the tenant's keys (may hold stale ids
                                                   of keys moved to another tenant: readers filter)
    <prefix>:{audit}:stream                  stream one entry per record, id "<seq>-0", field r
    <prefix>:{audit}:head                    hash  seq, hash of the last appended record
    <prefix>:{audit}:anchor                  hash  seq, hash of the last trimmed record
    <prefix>:{audit}:epoch                   string the store's epoch: a random id written once
                                                   (absent or changed: the store was wiped)
    <prefix>:{s:<tenant>:<session>}:state    string the session's state (JSON)
    <prefix>:{s:<tenant>:<session>}:events   stream one entry per SSE event, id "<seq>-0", field e
    <prefix>:{s:<tenant>:<session>}:lease    string the replica owning the live stream (PX expiry)
    <prefix>:{approvals}:records             hash  <tenant>:<id> -> the approval as put (JSON, verbatim)
    <prefix>:{approvals}:decisions           hash  <tenant>:<id> -> the decision merged into it (JSON)
    <prefix>:{approvals}:deadlines           zset  <tenant>:<id> scored by expires_at
    <prefix>:{approvals}:forget              zset  <tenant>:<id> scored by when it is forgotten
                                                   (expires_at + the retention given to put)
    <prefix>:{approvals}:order               zset  <tenant>:<id> scored by requested_at (every tenant)
    <prefix>:{approvals}:tenant:<tenant>     zset  <tenant>:<id> scored by requested_at (one tenant)
    <prefix>:{approvals}:pending:<tenant>    zset  <tenant>:<id> of the tenant's undecided approvals,
                                                   scored by expires_at (the caps count these)
    <prefix>:{approvals}:pending_keys        hash  <tenant>:<id> -> the key id (of pending ones)
    <prefix>:{releases}:records              hash  <model>:<version> -> the release as put (JSON, verbatim)
    <prefix>:{releases}:model:<model>        zset  the model's versions scored by created_at (ties:
                                                   by version, as Redis orders equal scores)
    <prefix>:{releases}:active               hash  model -> its active version
    <prefix>:{releases}:generations          hash  model -> its generation (absent: 0); bumped by
                                                   activations and by setting or clearing a canary
    <prefix>:{releases}:canaries             hash  model -> its running canary (JSON, verbatim);
                                                   absent: none (activation removes it)
    <prefix>:{releases}:history:<model>      list  activation history entries (JSON), newest first,
                                                   capped at release_record.HISTORY_CAP

A tenant's quota keys share the tag `t:<tenant>`, so one admit for a key and its tenant is one
script on one slot. The tenant is percent-encoded: a `}` or `:` in its name could otherwise end
the tag early or make two (tenant, scope) pairs spell the same key. The scope name comes last,
after a fixed word, so it needs no encoding.

A session's three keys share the tag `s:<tenant>:<session>` (both parts percent-encoded, so no
two (tenant, session) pairs spell the same tag), so each session script touches one slot. State
and events always share one expiry; the lease has its own, which saving or appending may cut to
the session's but never extends (a dead replica's lease must lapse after its own short TTL).

Approvals all share the tag `approvals` (like API keys share `keys`): listing across tenants,
newest first, is then one script on one slot, and there are few of them (a human decides each).
A member `<tenant>:<id>` has both parts percent-encoded, so `:` separates them unambiguously and
another tenant's id is another member. Nothing here expires per member: a script treats a member
whose forget time has passed as absent, and `approval_put` removes a batch of those for good. Each
key expires (PEXPIREAT) when the last approval it holds is forgotten.

Releases all share the tag `releases`: there are few (a handful of models, a release per
deployment), and activation (a compare-and-set on the generation that also checks the release
and appends to the history) is then one script on one slot. Models in key names and members are
percent-encoded, as are versions in members; hash fields and zset members holding one name only
are not (they cannot run into each other). Nothing expires: releases are the gateway's history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import quote

from gateway.store.base import WINDOW_S

# Buckets older than the window are never read again; the margin covers clock rounding.
WINDOW_TTL_S = WINDOW_S + 5
# Today's counter is needed until midnight, yesterday's only to settle requests spanning it.
DAILY_TTL_S = 2 * 86_400
# A lease set outlives its longest lease by this; renewing or taking a lease extends it.
LEASE_TTL_MARGIN_S = 5
# Forgotten approvals removed per approval_put: a put adds one, so this keeps well ahead.
APPROVAL_PURGE_BATCH = 100
# Members an approval listing reads per step while looking for `limit` matching ones.
APPROVAL_LIST_CHUNK = 100


@dataclass(frozen=True, slots=True)
class ScopeKeys:
    requests: str
    tokens: str
    daily: str
    leases: str


def _tenant_tag(prefix: str, tenant: str) -> str:
    return f"{prefix}:{{t:{quote(tenant, safe='')}}}"


def scope_keys(prefix: str, tenant: str, scope: str) -> ScopeKeys:
    base = _tenant_tag(prefix, tenant)
    return ScopeKeys(
        requests=f"{base}:requests:{scope}",
        tokens=f"{base}:tokens:{scope}",
        daily=f"{base}:daily:{scope}",
        leases=f"{base}:leases:{scope}",
    )


def key_records(prefix: str) -> str:
    return f"{prefix}:{{keys}}:records"


def key_digests(prefix: str) -> str:
    return f"{prefix}:{{keys}}:digests"


def tenant_key_ids(prefix: str, tenant: str) -> str:
    return f"{prefix}:{{keys}}:tenant:{tenant}"


def audit_stream(prefix: str) -> str:
    return f"{prefix}:{{audit}}:stream"


def audit_head(prefix: str) -> str:
    return f"{prefix}:{{audit}}:head"


def audit_anchor(prefix: str) -> str:
    return f"{prefix}:{{audit}}:anchor"


def store_epoch(prefix: str) -> str:
    return f"{prefix}:{{audit}}:epoch"


def stream_id(seq: int) -> str:
    """The stream entry id of audit record or session event `seq`: explicit, so XRANGE can
    start at a seq."""
    return f"{seq}-0"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    state: str
    events: str
    lease: str


def session_keys(prefix: str, tenant: str, session_id: str) -> SessionKeys:
    base = f"{prefix}:{{s:{quote(tenant, safe='')}:{quote(session_id, safe='')}}}"
    return SessionKeys(state=f"{base}:state", events=f"{base}:events", lease=f"{base}:lease")


def session_ttl_ms(ttl_s: float) -> int:
    """A session or lease TTL as PEXPIRE/PX milliseconds: rounded up, never 0 (which Redis refuses)."""
    return max(1, math.ceil(ttl_s * 1000))


def event_seq(entry_id: bytes | str) -> int:
    """The seq of a session event from its stream entry id `<seq>-0`."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.partition("-")[0])


@dataclass(frozen=True, slots=True)
class ApprovalKeys:
    records: str
    decisions: str
    deadlines: str
    forget: str
    order: str
    pending_keys: str


def approval_keys(prefix: str) -> ApprovalKeys:
    base = f"{prefix}:{{approvals}}"
    return ApprovalKeys(
        records=f"{base}:records",
        decisions=f"{base}:decisions",
        deadlines=f"{base}:deadlines",
        forget=f"{base}:forget",
        order=f"{base}:order",
        pending_keys=f"{base}:pending_keys",
    )


def approval_pending_base(prefix: str) -> str:
    """What a tenant's pending set name starts with; scripts append the member's tenant part."""
    return f"{prefix}:{{approvals}}:pending:"


def approval_pending(prefix: str, tenant: str) -> str:
    return approval_pending_base(prefix) + quote(tenant, safe="")


def approval_tenant_index_base(prefix: str) -> str:
    """What a tenant's index name starts with; the purge script appends the member's tenant part."""
    return f"{prefix}:{{approvals}}:tenant:"


def approval_tenant_index(prefix: str, tenant: str) -> str:
    return approval_tenant_index_base(prefix) + quote(tenant, safe="")


def approval_member(tenant: str, approval_id: str) -> str:
    return f"{quote(tenant, safe='')}:{quote(approval_id, safe='')}"


def approval_forget_ms(forget_at: float) -> int:
    """When the keys holding an approval may expire, as PEXPIREAT milliseconds (rounded up)."""
    return math.ceil(forget_at * 1000)


@dataclass(frozen=True, slots=True)
class ReleaseKeys:
    records: str
    active: str
    generations: str
    canaries: str


def release_keys(prefix: str) -> ReleaseKeys:
    base = f"{prefix}:{{releases}}"
    return ReleaseKeys(
        records=f"{base}:records",
        active=f"{base}:active",
        generations=f"{base}:generations",
        canaries=f"{base}:canaries",
    )


def release_versions(prefix: str, model: str) -> str:
    return f"{prefix}:{{releases}}:model:{quote(model, safe='')}"


def release_history(prefix: str, model: str) -> str:
    return f"{prefix}:{{releases}}:history:{quote(model, safe='')}"


def release_member(model: str, version: str) -> str:
    return f"{quote(model, safe='')}:{quote(version, safe='')}"


def all_keys_pattern(prefix: str) -> str:
    """A SCAN pattern matching every key of this prefix (for tests and maintenance)."""
    escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}:*"
