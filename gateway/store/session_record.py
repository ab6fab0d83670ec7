"""The records a session checkpoint carries across the seam: its state and the quota hold inside it.

They serialize to the JSON the stores kept before records were typed (same keys, same order), so a
session checkpointed by an older replica still resumes; both stores read them back through
`SessionState.from_json`, the one place a stored state is checked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

from gateway.store import fields

_WHAT = "a session state"
CHAT_COMPLETIONS = "chat.completions"  # the surface of a state that names none


@dataclass(frozen=True, slots=True)
class QuotaHold:
    """A streamed request's quota reservation, kept so that a replica taking the stream over settles
    it (with the whole answer's usage) instead of taking a second one."""

    tenant: str
    scopes: tuple[str, ...]  # the scopes' names: settling needs no limits
    lease_id: str
    tokens: int
    second: int
    day: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "scopes": list(self.scopes)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> QuotaHold:
        what = "a session's quota hold"
        scopes = raw.get("scopes")
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise ValueError(f"{what}'s scopes must be a list of names, not {scopes!r}")
        return cls(
            tenant=fields.text(raw, "tenant", what),
            scopes=tuple(scopes),
            lease_id=fields.text(raw, "lease_id", what),
            tokens=int(fields.number(raw, "tokens", what)),
            second=int(fields.number(raw, "second", what)),
            day=int(fields.number(raw, "day", what)),
        )


@dataclass(frozen=True, slots=True)
class SessionState:
    """What a stream's resume and takeover need. `body` (the request) and `transcript` (its
    messages and the answer, kept only if the request opted in) are the client's own JSON; they are
    absent from the stored JSON when None."""

    status: str  # "streaming" | "done"
    request_id: str | None = None
    quota: QuotaHold | None = None
    model: str | None = None
    body: dict[str, Any] | None = None
    completion_id: str | None = None
    created: int | None = None
    include_usage: bool = False
    key_id: str | None = None  # the key owning the session
    shared: bool = False  # usable by the owner's whole tenant
    owner: str | None = None  # the replica streaming it
    release: str | None = None
    deployments: tuple[str, ...] | None = None
    transcript: tuple[dict[str, Any], ...] | None = None
    # The API its client speaks (gateway/core/surface.py): a resume frames its events so. States
    # stored before surfaces were named are chat completions.
    surface: str = CHAT_COMPLETIONS
    # An answer kept as an object (a Responses response with store: true), in its surface's form:
    # its input items (with the continued answers' before them) and, once it ended, the answer as
    # its client last saw it. None for every other session.
    input_items: tuple[dict[str, Any], ...] | None = None
    answer: dict[str, Any] | None = None
    # What the answer repeats of its request (`ParsedRequest.echo`; the Responses API's): a replica
    # taking the stream over before any event was checkpointed writes it from here.
    echo: dict[str, Any] | None = None

    @property
    def kept(self) -> bool:
        """The session is a kept answer (retrievable by its id, continuable)."""
        return self.input_items is not None

    def to_dict(self) -> dict[str, Any]:
        """In the key order states were always stored in."""
        values: dict[str, Any] = {
            "request_id": self.request_id,
            "quota": None if self.quota is None else self.quota.to_dict(),
            "model": self.model,
            "body": self.body,
            "completion_id": self.completion_id,
            "created": self.created,
            "include_usage": self.include_usage,
            "key_id": self.key_id,
            "shared": self.shared,
            "status": self.status,
            "owner": self.owner,
            "release": self.release,
            "deployments": None if self.deployments is None else list(self.deployments),
            "transcript": None if self.transcript is None else list(self.transcript),
            # Absent for chat completions: their states are stored as they were before surfaces had names.
            "surface": None if self.surface == CHAT_COMPLETIONS else self.surface,
            "input_items": None if self.input_items is None else list(self.input_items),
            "answer": self.answer,
            "echo": self.echo,
        }
        return fields.without_none(values, ("body", "transcript", "surface", "input_items", "answer", "echo"))

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes | str) -> SessionState:
        return cls.from_dict(fields.json_object(orjson.loads(raw), "a stored session state"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SessionState:
        """Checked field by field (ValueError naming the field); unknown fields are ignored."""
        optional = fields.optional_text
        quota, body, answer, echo = raw.get("quota"), raw.get("body"), raw.get("answer"), raw.get("echo")
        created = fields.optional_number(raw, "created", _WHAT)
        return cls(
            status=fields.text(raw, "status", _WHAT),
            request_id=optional(raw, "request_id", _WHAT),
            quota=None if quota is None else QuotaHold.from_dict(fields.json_object(quota, "a session's quota hold")),
            model=optional(raw, "model", _WHAT),
            body=None if body is None else fields.json_object(body, "a session's request body"),
            completion_id=optional(raw, "completion_id", _WHAT),
            created=None if created is None else int(created),
            include_usage=raw.get("include_usage") is True,
            key_id=optional(raw, "key_id", _WHAT),
            shared=raw.get("shared") is True,
            owner=optional(raw, "owner", _WHAT),
            release=optional(raw, "release", _WHAT),
            deployments=_names(raw.get("deployments"), "deployments"),
            transcript=_messages(raw.get("transcript")),
            surface=optional(raw, "surface", _WHAT) or CHAT_COMPLETIONS,
            input_items=_objects(raw.get("input_items"), "input_items", "an input item"),
            answer=None if answer is None else fields.json_object(answer, "a session's kept answer"),
            echo=None if echo is None else fields.json_object(echo, "a session's echoed request"),
        )


def _names(value: object, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{_WHAT}'s {name} must be a list of names, not {value!r}")
    return tuple(value)


def _messages(value: object) -> tuple[dict[str, Any], ...] | None:
    return _objects(value, "transcript", "a transcript message")


def _objects(value: object, name: str, what: str) -> tuple[dict[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{_WHAT}'s {name} must be a list of objects, not {value!r}")
    return tuple(fields.json_object(m, what) for m in value)
