"""Fair admission under overload: a retry before the Retry-After a client was given is refused.

Without this, a client that retries 10 ms after a 429 meets every freed slot (of a deployment's
`max_inflight`, of a concurrency or rate quota) before a client that waits as it was told, and
gets several times its answers. So when a request of an API key is refused with a 429, the key
may not be admitted again before the Retry-After it was sent: a retry before then is refused at
once (429 `retry_too_early`, with the time still to wait) and never competes for capacity or
quota. And it is penalised: the wait the key was told starts again from that early retry. Only
refusing is not enough: a client polling every 10 ms arrives the instant the wait ends, while a
client that waits as told arrives a round trip later (`bench/fairness.py` measured 2x the answers
for the pollers). With the penalty a key that keeps retrying early keeps being refused until it
waits as told. It is per replica (replicas do not share it), which is enough when a client's
retries reach the replica that refused it, and harmless when they do not.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncGenerator, Callable

from gateway.core.chunks import Chunk
from gateway.errors import RateLimited, RetryTooEarly
from gateway.pipeline import Handler, RequestContext

# Entries for keys refused long ago are dropped when the table grows past this (it holds one
# entry per key currently told to wait, so it stays small unless there are that many keys).
_MAX_KEYS = 100_000


class RetryDiscipline:
    """The pipeline stage, right after authentication (it needs the key)."""

    def __init__(self, enabled: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self._enabled = enabled
        self._clock = clock
        self._not_before: dict[str, tuple[float, float]] = {}  # key id -> (admitted again from, wait told)
        self.refused = 0

    def check(self, key_id: str) -> None:
        """Refuse a request of `key_id` that comes before its Retry-After."""
        entry = self._not_before.get(key_id)
        if entry is None:
            return
        until, wait = entry
        now = self._clock()
        if now >= until:
            del self._not_before[key_id]
            return
        self.refused += 1
        self._not_before[key_id] = (now + wait, wait)  # the penalty: the wait starts again
        raise RetryTooEarly(
            f"Retried {until - now:.1f}s before the Retry-After this key was given; "
            f"retrying early starts the {wait:g}s wait again",
            retry_after_s=wait,
        )

    def told_to_wait(self, key_id: str, seconds: float) -> None:
        # What the client was told: Retry-After is whole seconds, rounded up.
        wait = float(max(1, math.ceil(seconds)))
        now = self._clock()
        if len(self._not_before) >= _MAX_KEYS:
            self._not_before = {k: e for k, e in self._not_before.items() if e[0] > now}
        if len(self._not_before) < _MAX_KEYS:
            current = self._not_before.get(key_id, (0.0, 0.0))
            self._not_before[key_id] = max(current, (now + wait, wait))

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        key_id = ctx.principal.key_id if self._enabled and ctx.principal is not None else None
        if key_id is not None:
            self.check(key_id)
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except RateLimited as refused:
            if key_id is not None and not isinstance(refused, RetryTooEarly):
                self.told_to_wait(key_id, refused.retry_after_s)
            raise
