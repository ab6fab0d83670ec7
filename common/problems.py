"""Naming a problem that validation found: where it is as a key path, and what it is.

Every message about a bad config, request, policy file, eval set or result file names the place
the same way: `('cases', 0, 'assertions', 1, 'pattern')` -> `cases[0].assertions[1].pattern`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

Loc = tuple[int | str, ...]


def key_path(loc: Iterable[int | str], skip: Callable[[str], bool] | None = None) -> str:
    """The key path of `loc`; "" for the document itself (each caller names its root its own way).

    `skip` leaves out parts that are not keys of the document: pydantic puts the names of union
    branches and validators into an error's location (`function-after[...]`, a tag, `str`).
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif skip is None or not skip(part):
            path = f"{path}.{part}" if path else part
    return path


def pydantic_message(error: Mapping[str, Any]) -> str:
    """A pydantic error's message without pydantic's wording around it."""
    message = str(error["msg"])
    if error["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    return message
