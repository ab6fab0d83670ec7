"""What both stores check and write when appending to the audit chain."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.store.base import AuditHead


def check_batch(expected: AuditHead, records: list[dict[str, Any]]) -> None:
    """Refuse a batch that does not continue `expected`: a caller bug, never a race."""
    for i, record in enumerate(records):
        seq, digest = record.get("seq"), record.get("hash")
        if type(seq) is not int or seq != expected.seq + 1 + i or not isinstance(digest, str):
            raise ValueError(f"audit record {i} must carry seq {expected.seq + 1 + i} and a hash")


def canonical(record: dict[str, Any]) -> bytes:
    """The bytes stored for a record: the same JSON the chain's hashes are computed over."""
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
