"""How the store's calls have been going: the failures live traffic sees, for readiness.

A readiness probe reads one key, so it answers for one hash slot: a Redis Cluster that lost a
slot range (a master and its replica) fails every call to those slots while the probe's slot is
served, until the cluster as a whole declares itself failed (seconds later, `cluster-node-timeout`).
Counting every store call's outcome closes that gap: when enough of the calls of the last few
seconds failed, the replica is not ready, whatever its probe says.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.settings import StoreReadinessSettings


class CallOutcomes:
    """Per-second counts of store calls that worked and that failed, over `window_s`."""

    def __init__(self, settings: StoreReadinessSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        size = max(1, int(settings.window_s))
        self._seconds = [-1] * size  # which second each slot counts; -1: none yet
        self._ok = [0] * size
        self._failed = [0] * size
        # A store back from an outage is ready again `recovered_after_s` after its last failed call,
        # not a window later. Time, not a run of calls that worked: with a slot range lost, the
        # probe's and the audit chain's slots are served, so runs of working calls are common while
        # a failure still comes every few requests.
        self._last_failure: float | None = None

    def record(self, failed: bool) -> None:
        now = self._clock()
        second = int(now)
        slot = second % len(self._seconds)
        if self._seconds[slot] != second:
            self._seconds[slot], self._ok[slot], self._failed[slot] = second, 0, 0
        if failed:
            self._failed[slot] += 1
            self._last_failure = now
        else:
            self._ok[slot] += 1

    def problem(self) -> str | None:
        """Why the store looks failing to live traffic, or None."""
        if self._last_failure is None or self._clock() - self._last_failure >= self._settings.recovered_after_s:
            return None
        oldest = int(self._clock()) - len(self._seconds)
        ok = failed = 0
        for index, second in enumerate(self._seconds):
            if second > oldest:
                ok, failed = ok + self._ok[index], failed + self._failed[index]
        settings = self._settings
        if failed < settings.min_failures or failed < settings.failure_ratio * (ok + failed):
            return None
        return f"{failed} of {ok + failed} store calls failed in the last {len(self._seconds)} s"
