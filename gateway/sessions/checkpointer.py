"""The checkpointer: copies each live session's log to the store, off the request path.

Every `checkpoint_every_events` events or `checkpoint_interval_s` (whichever comes first) it
writes every live session's news in one store call and renews the replica's lease on the
sessions it streams. Trade-off: a replica that dies loses at most the events of the last interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from gateway.errors import StoreUnavailable
from gateway.sessions.live import LiveSession, LiveSessions, ttl_of
from gateway.settings import SessionSettings
from gateway.store.base import SessionCheckpoint, SessionStore

# The name sessions logged under as one module, gateway/sessions.py: operators filter by it.
log = logging.getLogger("gateway.sessions")

_MAX_BACKOFF_S = 2.0  # checkpoint retries against a store that is down: at least this often
_LOG_EVERY_S = 10.0  # ... and a warning about it at most this often


class Checkpointer:
    def __init__(
        self,
        store: SessionStore,
        settings: SessionSettings,
        replica_id: str,
        live: LiveSessions,
        on_checkpoint: Callable[[float, int], None] | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._replica_id = replica_id
        self._live = live
        self._task: asyncio.Task[None] | None = None
        # Told (seconds, sessions) after each checkpoint write: telemetry records the latency.
        self.on_checkpoint = on_checkpoint
        self.failures = 0  # attempts that found the store unavailable

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._checkpoint_loop(), name="session-checkpoints")

    async def stop(self) -> None:
        """Finish the producers' work already recorded, write the last checkpoints, stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(StoreUnavailable):
            await self.checkpoint_all()

    async def _checkpoint_loop(self) -> None:
        # While the store is down, streams keep asking for checkpoints: retry with backoff instead
        # of at every wakeup, and say so once per _LOG_EVERY_S (issue 12: ~250 warnings/s).
        backoff, last_log = 0.0, -_LOG_EVERY_S
        wakeup = self._live.wakeup
        while True:
            if backoff:
                await asyncio.sleep(backoff)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._settings.checkpoint_interval_s):
                        await wakeup.wait()
            wakeup.clear()
            try:
                await self.checkpoint_all()
            except StoreUnavailable as error:
                self.failures += 1
                backoff = min(max(self._settings.checkpoint_interval_s, backoff * 2), _MAX_BACKOFF_S)
                if time.monotonic() - last_log >= _LOG_EVERY_S:
                    last_log = time.monotonic()
                    log.warning("session checkpoints delayed (retrying every %.1f s at most): %s", backoff, error)
                continue
            if backoff:
                log.info("session checkpoints resumed")
            backoff = 0.0

    async def checkpoint_all(self) -> None:
        """Write every live session's news in one store call; forget sessions fully written."""
        now = time.monotonic()
        batch: list[tuple[tuple[str, str], LiveSession, SessionCheckpoint]] = []
        for key, live in list(self._live.by_key.items()):
            item = self._checkpoint_of(live, now)
            if item is not None:
                batch.append((key, live, item))
        if not batch:
            return
        started = time.monotonic()
        await self._store.session_checkpoint([item for _, _, item in batch])
        if self.on_checkpoint is not None:
            self.on_checkpoint(time.monotonic() - started, len(batch))
        for key, live, item in batch:
            live.state_saved = True
            live.fresh = False
            live.flushed += len(item.events)
            if item.renew_owner is not None:
                live.renewed_at = now
            if item.release_owner is not None:
                self._live.by_key.pop(key, None)

    def _checkpoint_of(self, live: LiveSession, now: float) -> SessionCheckpoint | None:
        if live.log.closed and live.state.status != "done":
            # Not opted in to a transcript: the request (prompts) was kept only for a takeover, now
            # impossible; what stays is what a resume replays, the events.
            # A kept answer's request is in its conversation (the transcript) already.
            body = live.state.body if live.state.transcript is not None and not live.state.kept else None
            live.state, live.state_saved = replace(live.state, status="done", body=body), False
        pending = live.log.events[live.flushed :]
        lease = self._settings.lease_ttl_s
        renew = not live.log.closed and now - live.renewed_at >= lease / 3
        finished = live.log.closed
        if live.state_saved and not pending and not renew and not finished:
            return None
        return SessionCheckpoint(
            tenant=live.tenant,
            session_id=live.session_id,
            ttl_s=ttl_of(live.state, self._settings),
            state=None if live.state_saved else live.state,
            events=pending,
            renew_owner=self._replica_id if renew else None,
            lease_ttl_s=lease,
            release_owner=self._replica_id if finished else None,
            replace_events=live.fresh and live.flushed == 0,
        )
