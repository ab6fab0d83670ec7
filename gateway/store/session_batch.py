"""Checks both stores make on session calls before touching anything, so that bad arguments fail
the same way (ValueError) everywhere instead of as a backend error."""

from __future__ import annotations

import math

from gateway.store.base import SessionCheckpoint


def check_ttl(ttl_s: float) -> None:
    if not (ttl_s > 0 and math.isfinite(ttl_s)):
        raise ValueError(f"a session TTL must be a positive number of seconds, not {ttl_s!r}")


def check_events(events: list[tuple[int, bytes]]) -> None:
    """Seqs are positive integers (a Redis stream cannot hold id 0-0). Order is not checked
    here: an event not above the ones before it is skipped like an already-stored one."""
    for seq, payload in events:
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise ValueError(f"session event seqs must be integers >= 1, not {seq!r}")
        if not isinstance(payload, bytes):
            raise ValueError(f"session event payloads must be bytes, not {type(payload).__name__}")


def check_open(first: SessionCheckpoint) -> None:
    """`session_open`'s argument: a checkpoint that names the owner claiming the lease."""
    check_ttl(first.ttl_s)
    check_events(first.events)
    if not first.renew_owner:
        raise ValueError("session_open claims the lease: the checkpoint must name its owner (renew_owner)")
    check_ttl(first.lease_ttl_s)


def newer_events(events: list[tuple[int, bytes]], last_seq: int) -> list[tuple[int, bytes]]:
    """The events to store after `last_seq`: each must be above every seq before it."""
    kept = []
    for seq, payload in events:
        if seq > last_seq:
            kept.append((seq, payload))
            last_seq = seq
    return kept
