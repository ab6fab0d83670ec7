"""What a client may be told when something fails: the gateway's own words, never its internals.

Any test that drives a fault can call `assert_tells_nothing_internal(reply)` on what came back (an
httpx response read in full, or the text of one error): every 4xx/5xx body and every in-band error
event of a stream is checked for an address, a port, an exception class name, a filesystem path
or a library's own message. `internals_in(text)` names what it found, for a test that collects
findings across many requests and reports them together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import httpx
import orjson

from common.sse_reader import read_events

# Each pattern with what it means; what matched is reported with its name.
_INTERNALS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an IPv4 address", re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")),
    ("an IPv6 address", re.compile(r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\]|(?<![\w:])::1\b")),
    ("a port", re.compile(r"(?:\blocalhost|\]|\b[a-z][\w-]*(?:\.[\w-]+)+|\d):\d{2,5}\b|\bport \d{2,5}\b", re.I)),
    # Case-sensitive: "internal_error" and "an error" are the gateway's words, "ConnectionError" is not.
    ("an exception class name", re.compile(r"\b\w*(?:Error|Exception)\b|\b\w+Error\(|\bErrno\b")),
    ("a filesystem path", re.compile(r"(?<![\w/])/(?:tmp|home|root|var|usr|opt|etc|proc|run|srv/data)/")),
    (
        "a library's message",
        re.compile(
            r"Traceback|NoneType|has no attribute|Connection refused|connecting to|Timeout reading|"
            r"Timeout writing|Connection reset|Broken pipe|[Cc]onnection lost|database is locked|"
            r"unable to open database|validation error for|\b(?:redis|sqlite3?|httpx2?|httpcore|anyio|uvloop|"
            r"uvicorn|orjson|pydantic|asyncio|starlette|litellm)\b",
            re.I,
        ),
    ),
)


def internals_in(text: str) -> list[str]:
    """What of the gateway's internals `text` gives away, as "<kind>: <what matched>"."""
    found = []
    for kind, pattern in _INTERNALS:
        found += [f"{kind}: {match.group(0)!r}" for match in pattern.finditer(text)]
    return found


def error_texts(reply: httpx.Response) -> list[str]:
    """The parts of a response a client reads as an error: a 4xx/5xx body whole; of a 200 event
    stream, each event whose payload has an `error`. The response must have been read."""
    if reply.status_code >= 400:
        return [reply.text]
    if not reply.headers.get("content-type", "").startswith("text/event-stream"):
        return []
    return [text for text in _event_payloads(reply.content) if _is_error_event(text)]


def _event_payloads(body: bytes) -> list[str]:
    return [data.decode(errors="replace") for data, _, _ in read_events(body) if data != b"[DONE]"]


def _is_error_event(text: str) -> bool:
    try:
        payload: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        return True  # not JSON: whatever it is, the client reads it
    return isinstance(payload, dict) and "error" in payload


def error_messages(reply: httpx.Response) -> list[str]:
    """The `error.message` of each error text of `reply` (those in OpenAI's shape)."""
    messages = []
    for text in error_texts(reply):
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            messages.append(error["message"])
    return messages


def leaks_of(reply: httpx.Response, label: str = "") -> list[str]:
    """Every finding of every error text of `reply`, each prefixed with `label` and the status."""
    where = f"{label} (HTTP {reply.status_code})".strip()
    return [f"{where}: {finding} in {text[:300]!r}" for text in error_texts(reply) for finding in internals_in(text)]


def assert_tells_nothing_internal(reply: httpx.Response | str, label: str = "") -> None:
    """Fail, naming each finding, if `reply` (a read response, or the text of one error) gives
    away an address, a port, an exception class, a path or a library's message."""
    if isinstance(reply, str):
        findings = [f"{label}: {finding} in {reply[:300]!r}" for finding in internals_in(reply)]
    else:
        findings = leaks_of(reply, label)
    assert not findings, "\n".join(findings)


def assert_none_leak(findings: Iterable[str]) -> None:
    """For tests that collect `leaks_of` over many replies: fail once, listing them all."""
    listed = list(findings)
    assert not listed, f"{len(listed)} internal details reached clients:\n" + "\n".join(listed[:40])
