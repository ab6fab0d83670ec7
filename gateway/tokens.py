"""The gateway's own token counts: what it reserves before a call and what it can vouch for after.

A backend's `usage` is what it says; these are what the gateway saw. The prompt estimate only
needs to be in the right range, since reservations are reconciled with the real usage. The
relayed count is a floor: no tokenizer writes more than `CHARS_PER_TOKEN_FLOOR` characters a
token in real text (English averages about 4, code 3, CJK under 2), so an honest backend's
count is never below it, and a backend reporting less than it relayed is charged the floor.
"""

from __future__ import annotations

from typing import Any

import orjson

CHARS_PER_TOKEN_FLOOR = 8


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    # ~4 characters per token is the usual rule of thumb for what the prompt will cost.
    size = len(orjson.dumps(body.get("messages", ()))) + len(orjson.dumps(body.get("tools", ())))
    return size // 4 + 1


def floor_tokens(characters: int) -> int:
    """The fewest tokens `characters` characters of output can be."""
    return -(-characters // CHARS_PER_TOKEN_FLOOR)
