"""The hash chain itself: any edit, deletion, insertion or reordering is found and named."""

from __future__ import annotations

import copy
import dataclasses

from gateway.audit.writer import chain, record_hash, verify_records
from gateway.store.base import AuditHead, AuditRecord

GENESIS = AuditHead(0, "")


def records(n: int = 6) -> list[AuditRecord]:
    return chain(GENESIS, [{"kind": "request", "ts": 1000.0 + i, "status": 200, "i": i} for i in range(n)])


def test_an_untouched_chain_verifies() -> None:
    verdict = verify_records(records(), GENESIS)
    assert verdict.ok
    assert verdict.checked == 6


def test_chain_continues_from_a_head() -> None:
    first = records(3)
    head = AuditHead(first[-1].seq, first[-1].hash)
    second = chain(head, [{"kind": "admin"}])
    assert second[0].seq == 4
    assert verify_records(first + second, GENESIS).ok


def test_edited_record_is_named() -> None:
    tampered = records()
    tampered[2].body["status"] = 500
    verdict = verify_records(tampered, GENESIS)
    assert not verdict.ok
    assert verdict.first_bad_seq == 3
    assert "edited" in verdict.reason


def test_edit_with_a_recomputed_hash_breaks_the_next_link() -> None:
    tampered = records()
    tampered[2].body["status"] = 500
    tampered[2] = dataclasses.replace(tampered[2], hash=record_hash(tampered[2].to_dict()))
    verdict = verify_records(tampered, GENESIS)
    assert verdict.first_bad_seq == 4


def test_deleted_record_is_found_where_it_was() -> None:
    tampered = records()
    del tampered[3]
    assert verify_records(tampered, GENESIS).first_bad_seq == 4


def test_inserted_record_is_found() -> None:
    tampered = records()
    forged = copy.deepcopy(tampered[1])
    forged.body["status"] = 403
    tampered.insert(2, forged)
    assert verify_records(tampered, GENESIS).first_bad_seq == 3


def test_reordered_records_are_found() -> None:
    tampered = records()
    tampered[1], tampered[2] = tampered[2], tampered[1]
    assert verify_records(tampered, GENESIS).first_bad_seq == 2


def test_truncated_chain_from_an_anchor_still_verifies() -> None:
    full = records()
    anchor = AuditHead(full[2].seq, full[2].hash)
    assert verify_records(full[3:], anchor).ok
    assert not verify_records(full[3:], GENESIS).ok
