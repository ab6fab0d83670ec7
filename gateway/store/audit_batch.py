"""What both stores share about the audit chain: the record that crosses the seam, what they check
when appending, and the bytes they keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.store import fields


@dataclass(frozen=True, slots=True)
class AuditHead:
    """The end of the audit chain: the last record's sequence number and hash (0 and "" when empty)."""

    seq: int
    hash: str


# The fields that chain a record; everything else is its body.
CHAIN_FIELDS = ("seq", "prev", "mac", "hash")


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One link of the hash chain. `body` is what was recorded (a request, an admin action...: a
    JSON object whose shape is its kind's, and whose every byte the hash covers); `seq`, `prev`,
    `mac` and `hash` chain it. Stored flat, as one canonical JSON object, as always."""

    seq: int
    prev: str
    hash: str
    body: dict[str, Any]
    mac: str | None = None  # "hmac-sha256" when `hash` is an HMAC under audit.hmac_key

    def to_dict(self) -> dict[str, Any]:
        chained = {**self.body, "seq": self.seq, "prev": self.prev}
        if self.mac is not None:
            chained["mac"] = self.mac
        chained["hash"] = self.hash
        return chained

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AuditRecord:
        """Checked field by field (ValueError naming the field)."""
        what = "an audit record"
        seq = raw.get("seq")
        if type(seq) is not int:
            raise ValueError(f"{what}'s seq must be an integer, not {seq!r}")
        return cls(
            seq=seq,
            prev=fields.text(raw, "prev", what),
            hash=fields.text(raw, "hash", what),
            body={k: v for k, v in raw.items() if k not in CHAIN_FIELDS},
            mac=fields.optional_text(raw, "mac", what),
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> AuditRecord:
        return cls.from_dict(fields.json_object(orjson.loads(raw), "a stored audit record"))


def check_batch(expected: AuditHead, records: list[AuditRecord]) -> None:
    """Refuse a batch that does not continue `expected`: a caller bug, never a race."""
    for i, record in enumerate(records):
        if record.seq != expected.seq + 1 + i:
            raise ValueError(f"audit record {i} must carry seq {expected.seq + 1 + i} and a hash")


def canonical(record: dict[str, Any]) -> bytes:
    """The bytes stored for a record: the same JSON the chain's hashes are computed over."""
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
