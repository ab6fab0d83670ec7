"""Strings that match a simple JSON-Schema `pattern`, so a tool schema that says what an id looks
like (`^ord_[0-9]+$`) gets ids a policy with the same rule accepts.

The subset: literals and escaped characters, `.`, `\\d`, `\\w`, `\\s`, character classes with
ranges (`[A-Za-z0-9_-]`, not negated), the quantifiers `?`, `*`, `+`, `{n}`, `{n,}`, `{n,m}`, and
`^` / `$` at the ends. Anything else (groups, alternation, lookarounds) gives None, and the caller
falls back to a word. Every result is checked against the pattern before it is used.
"""

from __future__ import annotations

import random
import re
import string

_CLASSES = {"d": string.digits, "w": string.ascii_letters + string.digits + "_", "s": " "}
_ANY = string.ascii_lowercase + string.digits
_UNSUPPORTED = set("()|")
_QUANTIFIER = re.compile(r"\?|\*|\+|\{(\d+)(,(\d*))?\}")
_MAX_REPEAT = 4  # an open-ended `+` or `*` repeats at most this often


def string_matching(pattern: str, rng: random.Random) -> str | None:
    """A string that `re.search(pattern, ...)` accepts, or None if the pattern is beyond the subset."""
    body = pattern.removeprefix("^")
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    out: list[str] = []
    i = 0
    while i < len(body):
        atom, i = _atom(body, i)
        if atom is None:
            return None
        low, high, i = _repeat(body, i)
        out.extend(rng.choice(atom) for _ in range(rng.randint(low, high)))
    candidate = "".join(out)
    try:
        return candidate if re.search(pattern, candidate) else None
    except re.error:
        return None


def _atom(body: str, i: int) -> tuple[str | None, int]:
    """The characters one position may take, and where the pattern continues."""
    char = body[i]
    if char in _UNSUPPORTED or char in "^$?*+{":
        return None, i
    if char == "\\":
        if i + 1 >= len(body):
            return None, i
        escaped = body[i + 1]
        return _CLASSES.get(escaped, escaped if not escaped.isalnum() else None), i + 2
    if char == ".":
        return _ANY, i + 1
    if char == "[":
        end = body.find("]", i + 2)
        if end < 0 or body[i + 1] == "^":
            return None, i
        return _class(body[i + 1 : end]), end + 1
    return char, i + 1


def _class(spec: str) -> str | None:
    chars: list[str] = []
    i = 0
    while i < len(spec):
        if spec[i] == "\\" and i + 1 < len(spec):
            chars.append(_CLASSES.get(spec[i + 1], spec[i + 1]))
            i += 2
        elif i + 2 < len(spec) and spec[i + 1] == "-":
            chars.extend(chr(c) for c in range(ord(spec[i]), ord(spec[i + 2]) + 1))
            i += 3
        else:
            chars.append(spec[i])
            i += 1
    return "".join(chars) or None


def _repeat(body: str, i: int) -> tuple[int, int, int]:
    match = _QUANTIFIER.match(body, i)
    if match is None:
        return 1, 1, i
    token = match.group(0)
    if token == "?":
        return 0, 1, match.end()
    if token == "*":
        return 0, _MAX_REPEAT, match.end()
    if token == "+":
        return 1, _MAX_REPEAT, match.end()
    low = int(match.group(1))
    if match.group(2) is None:
        return low, low, match.end()
    high = int(match.group(3)) if match.group(3) else low + _MAX_REPEAT
    return low, max(low, high), match.end()
