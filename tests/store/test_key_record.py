"""The stored API key: the shape keys were always kept in reads back; anything else is a
ValueError naming the field (which the stores turn into StoreCorrupt)."""

from __future__ import annotations

import orjson
import pytest

from gateway.core.principal import Limits
from gateway.store.key_record import KeyRecord
from tests.store.helpers import key_record

# A key as the gateway stored it before its record was checked field by field.
STORED_KEY = {
    "id": "key_1",
    "name": "ci",
    "tenant": "acme",
    "digest": "ab" * 32,
    "prefix": "agw_abcdefgh",
    "scopes": ["chat"],
    "models": [],
    "limits": {"rpm": 10, "tpm": None, "max_concurrency": None, "daily_tokens": 5000},
    "created_at": 1000.5,
    "expires_at": None,
    "revoked_at": None,
}


def test_a_stored_key_reads_back_and_writes_the_same_json() -> None:
    record = KeyRecord.from_json(orjson.dumps(STORED_KEY))
    assert record.limits == Limits(rpm=10, daily_tokens=5000)
    assert record.scopes == ("chat",)
    assert record.to_dict() == {**STORED_KEY, "scopes": ("chat",), "models": ()}
    assert KeyRecord.from_dict(orjson.loads(orjson.dumps(key_record("k1").to_dict()))) == key_record("k1")


def test_fields_a_newer_gateway_added_are_ignored() -> None:
    record = KeyRecord.from_dict({**STORED_KEY, "owner": "x", "limits": {"rpm": 1, "burst": 3}})
    assert record.limits == Limits(rpm=1)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"id": 7}, "id"),
        ({"tenant": None}, "tenant"),
        ({"scopes": "chat"}, "scopes"),
        ({"models": [1]}, "models"),
        ({"limits": [1]}, "limits"),
        ({"limits": {"rpm": "10"}}, "rpm"),
        ({"limits": {"tpm": 1.5}}, "tpm"),
        ({"created_at": "now"}, "created_at"),
        ({"revoked_at": True}, "revoked_at"),
    ],
)
def test_a_malformed_field_is_a_value_error_naming_it(change: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        KeyRecord.from_dict({**STORED_KEY, **change})


@pytest.mark.parametrize("raw", [b'{"id": "k1"', b"[]", b"null", b'{"id": "k1"}'])
def test_what_is_not_a_key_record_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"JSON|API key|unexpected"):
        KeyRecord.from_json(raw)
