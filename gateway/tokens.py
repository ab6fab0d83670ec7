"""The gateway's own token counts: what it reserves before a call and what it can vouch for after.

A backend's `usage` is what it says; these are what the gateway saw. The prompt estimate only
needs to be in the right range, since reservations are reconciled with the real usage. The
relayed count is a floor: no tokenizer writes more than `CHARS_PER_TOKEN_FLOOR` characters a
token in real text (English averages about 4, code 3, CJK under 2), so an honest backend's
count is never below it, and a backend reporting less than it relayed is charged the floor.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from gateway.core.chunks import Chunk, Usage

CHARS_PER_TOKEN_FLOOR = 8


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    # ~4 characters per token is the usual rule of thumb for what the prompt will cost.
    size = len(orjson.dumps(body.get("messages", ()))) + len(orjson.dumps(body.get("tools", ())))
    if "input" in body:  # an embeddings request's text (or token ids: an overestimate, never under)
        size += len(orjson.dumps(body["input"]))
    return size // 4 + 1


def floor_tokens(characters: int) -> int:
    """The fewest tokens `characters` characters of output can be."""
    return -(-characters // CHARS_PER_TOKEN_FLOOR)


def counted(usage: Usage, estimated_prompt: int, relayed: int) -> Usage:
    """The usage to report and bill: the upstream's, with the gateway's count of what it relayed
    as a floor under `completion_tokens`, and its prompt estimate for a prompt reported as 0 (no
    prompt is empty). Figures an upstream could not have reported are replaced outright."""
    if not usage.trusted:
        usage = Usage(continuation_prompt_tokens=usage.continuation_prompt_tokens, trusted=False)
    prompt = usage.prompt_tokens or estimated_prompt
    completion = max(usage.completion_tokens, relayed)
    total = max(usage.total_tokens, prompt + completion)
    if (prompt, completion, total) == (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens):
        return usage
    return replace(usage, prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


def output_characters(chunk: Chunk) -> int:
    """The characters of model output in one chunk: text, reasoning and tool-call arguments."""
    size = len(chunk.content or "") + len(chunk.reasoning or "")
    for call in chunk.tool_calls:
        size += len(call.arguments) + len(call.name or "")
    return size
