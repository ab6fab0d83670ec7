"""The surface seam: how an API a client speaks meets the kernel.

A surface (Chat Completions today; Responses and Anthropic Messages are additions of the same
shape) is a translator at the edge. Going in, it turns a request body into the internal request,
an OpenAI chat request's JSON (`ParsedRequest`), which every stage, the router and every backend
speak. Coming out, it turns the kernel's chunks into its own events (`AnswerWriter`), a collected
answer into its own body, and a `GatewayError` into its own error shape. Nothing below the HTTP
layer knows which surface a request came by: the stages read `ctx.surface.name` only as a label
(audit records, telemetry), and sessions hold a surface only to write and frame its events.

A streamed answer's events are the payloads of a session's log (byte-exact what the client was
sent, for `Last-Event-ID` resume): the surface frames them as SSE and names the terminal event, and
it reads back the assistant text an event carried when another replica takes the stream over.
The session's state records the surface's `name`, so that a replica resuming it from the store
frames and continues it in the same form (`Surfaces.named`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.answer import Answer
from gateway.core.chunks import Chunk, Usage
from gateway.errors import GatewayError


@dataclass(frozen=True, slots=True)
class Continuity:
    """What a request asks of the answers kept before and after it, for a surface whose answers
    are objects of their own (a Responses response, retrieved and continued by its id)."""

    store: bool  # keep this answer: retrievable by its id, and continued by a later request
    previous: str | None  # the id of a kept answer whose conversation this request goes on with
    # How many leading messages of the body are this request's own setup (its instructions),
    # not conversation: a later request continuing this one does not inherit them.
    preamble: int
    # The request's input in the surface's own form, each with an id: kept with the answer.
    items: tuple[dict[str, Any], ...] = ()
    # Made in the background (Responses `background: true`): streamed into its session whether or
    # not anyone reads it, and answered at once with the answer as it began, unless the client
    # follows its events (`background_events`).
    background: bool = False
    background_events: bool = False


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A client's request in the kernel's form."""

    body: dict[str, Any]  # an OpenAI chat request's JSON: what the stages read and rewrite
    model: str
    stream: bool
    include_usage: bool  # a streamed answer ends with a usage event
    # What the surface's answer repeats of the request (the Responses object echoes its
    # parameters): opaque to the kernel, handed back to the surface in the AnswerHead.
    echo: Mapping[str, Any] = field(default_factory=dict)
    continuity: Continuity | None = None  # None: the surface keeps no answers (chat completions)
    operation: str = "chat"  # what the deployments are asked (settings.Operation): "embeddings" for embeddings


@dataclass(frozen=True, slots=True)
class AnswerHead:
    """What every event of one answer repeats."""

    answer_id: str
    created: int
    model: str
    include_usage: bool
    resumed: tuple[str, int] | None = None  # (text, chunks) already sent, when taking a stream over
    echo: Mapping[str, Any] = field(default_factory=dict)  # ParsedRequest.echo
    # When taking a stream over: the payloads the dead replica's writer had made, for a surface
    # whose events carry state across the stream (Responses: sequence numbers, open items).
    replayed: tuple[bytes, ...] = ()


class AnswerWriter(Protocol):
    """One streamed answer's event payloads in its surface's form, called in order: `chunk` for
    every chunk, then `end` once (a complete answer) or `fail` once (it cannot go on)."""

    def chunk(self, chunk: Chunk) -> list[bytes]: ...

    def end(self, usage: Usage) -> list[bytes]: ...

    def fail(self, error: GatewayError) -> list[bytes]: ...


class Surface(Protocol):
    @property
    def name(self) -> str:
        """A stable label: in audit records, telemetry and a session's stored state."""
        ...

    @property
    def path(self) -> str:
        """The route it is served on (`POST` only)."""
        ...

    @property
    def id_prefix(self) -> str:
        """What its answers' ids start with (`chatcmpl-`, `resp_`)."""
        ...

    @property
    def answer_sessions(self) -> bool:
        """Each answer is a session of its own, named by the answer's id (a Responses response is
        retrieved, continued and resumed by its id); otherwise sessions are named by the client."""
        ...

    @property
    def done(self) -> bytes | None:
        """The payload of the event that ends every stream, if the surface has one (`[DONE]`)."""
        ...

    def parse(self, body: bytes, max_json_depth: int) -> ParsedRequest:
        """The request in the kernel's form; `InvalidRequest` naming the bad field otherwise."""
        ...

    def writer(self, head: AnswerHead) -> AnswerWriter: ...

    def collected(self, head: AnswerHead, answer: Answer, usage: Usage) -> dict[str, Any]:
        """A non-streamed answer's body."""
        ...

    def error_status(self, error: GatewayError) -> int: ...

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        """The body of an error response, and of an in-band error event."""
        ...

    def frame(self, seq: int | None, payload: bytes) -> bytes:
        """One SSE event: with its id when it is a session log's, for `Last-Event-ID`."""
        ...

    def text_of(self, payload: bytes) -> str:
        """The assistant text an event carries ("" for other events)."""
        ...

    def answer_of(self, payload: bytes) -> dict[str, Any] | None:
        """The answer object an event carries as it stood then (a Responses lifecycle event's
        `response`): what a kept answer is retrieved as. None for other events and surfaces."""
        ...

    def answer_items(self, answer: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A kept answer's output as input items, for the item history of a request continuing it."""
        ...


class Surfaces:
    """The surfaces a gateway serves, by name: a stored session names its own."""

    def __init__(self, surfaces: Iterable[Surface]) -> None:
        self._by_name: Mapping[str, Surface] = {s.name: s for s in surfaces}

    def named(self, name: str) -> Surface | None:
        return self._by_name.get(name)
