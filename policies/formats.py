"""The JSON Schema `format`s a tool-argument schema may use, and the gateway's own checks for them.

jsonschema's stock checker quietly passes any format whose optional library is not installed
(`uri` without rfc3987, say), so what it enforces depends on the machine. These checks are
self-contained and strict where tool servers are lax: a value a tool would misread is refused here.
A schema naming any other format is refused when the policy file loads, so a `format` in a rule is
never decoration.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import date, datetime

from jsonschema import FormatChecker

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
# RFC 3339 section 5.6: a full date, "T", a time with seconds, an optional fraction, an offset.
_DATE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII)
_TIME = re.compile(r"(\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.ASCII)
# A practical address: RFC 5322 dot-atom local part, a domain of at least two labels; no quoted
# local parts, comments or IP literals (the forms header injection and parser confusion live in).
_EMAIL = re.compile(
    rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@{_LABEL}(?:\.{_LABEL})+"
)
# RFC 3986: only unreserved, reserved and well-formed percent-escapes; a URI needs a scheme.
_URI_CHARS = r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*"
_URI = re.compile(rf"[A-Za-z][A-Za-z0-9+.-]*:{_URI_CHARS}", re.ASCII)
_URI_REFERENCE = re.compile(_URI_CHARS, re.ASCII)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", re.ASCII)

CHECKER = FormatChecker(formats=())


def _string(instance: object) -> str | None:
    return instance if isinstance(instance, str) else None  # formats constrain strings only


@CHECKER.checks("date-time")
def _is_date_time(instance: object) -> bool:
    text = _string(instance)
    if text is None:
        return True
    match = _DATE_TIME.fullmatch(text)
    return match is not None and _valid_date(match.group(1)) and _valid_time(match.group(2), match.group(4))


@CHECKER.checks("date")
def _is_date(instance: object) -> bool:
    text = _string(instance)
    return text is None or (_DATE.fullmatch(text) is not None and _valid_date(text))


@CHECKER.checks("time")
def _is_time(instance: object) -> bool:
    text = _string(instance)
    if text is None:
        return True
    match = _TIME.fullmatch(text)
    return match is not None and _valid_time(match.group(1), match.group(3))


def _valid_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _valid_time(clock: str, offset: str) -> bool:
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        datetime.fromisoformat(f"2000-01-01T{clock}{offset}")
    except ValueError:
        return False
    return True


@CHECKER.checks("email")
def _is_email(instance: object) -> bool:
    text = _string(instance)
    if text is None:
        return True
    local, _, _ = text.partition("@")
    return len(text) <= 254 and len(local) <= 64 and _EMAIL.fullmatch(text) is not None


@CHECKER.checks("hostname")
def _is_hostname(instance: object) -> bool:
    text = _string(instance)
    return text is None or (len(text) <= 253 and _HOSTNAME.fullmatch(text) is not None)


@CHECKER.checks("uri")
def _is_uri(instance: object) -> bool:
    text = _string(instance)
    return text is None or _URI.fullmatch(text) is not None


@CHECKER.checks("uri-reference")
def _is_uri_reference(instance: object) -> bool:
    text = _string(instance)
    return text is None or _URI_REFERENCE.fullmatch(text) is not None


@CHECKER.checks("uuid")
def _is_uuid(instance: object) -> bool:
    text = _string(instance)
    return text is None or _UUID.fullmatch(text) is not None


@CHECKER.checks("ipv4")
def _is_ipv4(instance: object) -> bool:
    text = _string(instance)
    return text is None or _parses(ipaddress.IPv4Address, text)


@CHECKER.checks("ipv6")
def _is_ipv6(instance: object) -> bool:
    text = _string(instance)
    return text is None or _parses(ipaddress.IPv6Address, text)


def _parses(kind: type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address], text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return text.isascii()


SUPPORTED = frozenset(CHECKER.checkers)
