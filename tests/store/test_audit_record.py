"""The typed audit record: it stores as the same canonical JSON the chain always hashed (so existing
chains still load and verify), and a stored record whose chain fields are broken fails at the seam."""

from __future__ import annotations

import orjson
import pytest

from gateway.audit.writer import MAC, chain, record_hash
from gateway.store.audit_batch import AuditRecord, canonical
from gateway.store.base import AuditHead

# As the writer chained a keyed request record before records were typed.
STORED = {"kind": "request", "ts": 1000.5, "tenant": "acme", "usage": {"total_tokens": 3}}


def test_an_audit_record_stores_as_the_canonical_json_its_hash_covers() -> None:
    (record,) = chain(AuditHead(4, "ab" * 32), [STORED], key=b"k")
    raw = {**STORED, "seq": 5, "prev": "ab" * 32, "mac": MAC, "hash": record.hash}
    assert canonical(record.to_dict()) == canonical(raw)
    assert record.hash == record_hash(raw, b"k")
    assert AuditRecord.from_json(canonical(raw)) == record
    assert record.body == STORED


@pytest.mark.parametrize(("field", "value"), [("seq", "5"), ("seq", None), ("prev", 1), ("hash", None), ("mac", 2)])
def test_a_stored_record_with_broken_chain_fields_is_refused_naming_the_field(field: str, value: object) -> None:
    raw = {**STORED, "seq": 5, "prev": "", "hash": "cd" * 32, field: value}
    with pytest.raises(ValueError, match=field):
        AuditRecord.from_json(orjson.dumps(raw))
