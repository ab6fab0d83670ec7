"""Where a plain rollback goes: back through the activation history, never forward again.

The history is replayed as a stack: a promotion pushes its release; a rollback pops back down to
its target (or, when it named a release that is not on the stack, pushes that one). The release a
plain rollback returns to is the one under the top, so rolling back twice from v3 goes to v2 and
then v1, and never re-activates the release just rolled back from unless someone names it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.store.release_record import HistoryEntry

ROLLBACK = "release.rollback"


def activation_stack(history_newest_first: Iterable[HistoryEntry]) -> list[str]:
    stack: list[str] = []
    for entry in reversed(list(history_newest_first)):
        version = entry.to
        if entry.action == ROLLBACK and version in stack:
            del stack[stack.index(version) + 1 :]
        elif not stack or stack[-1] != version:
            stack.append(version)
    return stack


def rollback_target(history_newest_first: Iterable[HistoryEntry], active: str | None) -> str | None:
    """The release a plain rollback activates, or None when there is none to go back to."""
    stack = activation_stack(history_newest_first)
    if active is None or not stack or stack[-1] != active or len(stack) < 2:
        return None
    return stack[-2]
