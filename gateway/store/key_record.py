"""An API key as both stores keep it, and the one way a stored key reads back.

A key record is read on every authenticated request (by its digest), so a malformed one must fail
as the store's typed StoreCorrupt, naming the record, and never as a TypeError deep in the auth
stage (a 500 with a traceback, as it was). The JSON is the same shape as before the record was
checked field by field, so existing keys still load; fields this version does not know are ignored,
so a newer replica's additions do not lock an older one out of every key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import orjson

from gateway.core.principal import Limits
from gateway.store import fields as read

_WHAT = "an API key"


def _limits(raw: object) -> Limits:
    values = read.json_object(raw, f"{_WHAT}'s limits")
    checked = {}
    for limit in fields(Limits):
        value = values.get(limit.name)
        checked[limit.name] = None if value is None else read.integer(values, limit.name, f"{_WHAT}'s limits")
    return Limits(**checked)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """An API key as stored: never the secret, only its SHA-256 digest."""

    id: str
    name: str
    tenant: str
    digest: str
    prefix: str  # the first characters of the secret, to recognise a key in listings
    scopes: tuple[str, ...]
    models: tuple[str, ...]  # empty: every model
    limits: Limits
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: object) -> KeyRecord:
        """The record in `raw`, each field checked: ValueError naming the first bad one."""
        values = read.json_object(raw, _WHAT)
        return cls(
            id=read.text(values, "id", _WHAT),
            name=read.text(values, "name", _WHAT),
            tenant=read.text(values, "tenant", _WHAT),
            digest=read.text(values, "digest", _WHAT),
            prefix=read.text(values, "prefix", _WHAT),
            scopes=read.names(values, "scopes", _WHAT),
            models=read.names(values, "models", _WHAT),
            limits=_limits(values.get("limits")),
            created_at=read.number(values, "created_at", _WHAT),
            expires_at=read.optional_number(values, "expires_at", _WHAT),
            revoked_at=read.optional_number(values, "revoked_at", _WHAT),
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> KeyRecord:
        return cls.from_dict(orjson.loads(raw))
