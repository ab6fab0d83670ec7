"""This replica's view of each model's active release: read by the request path, written by the
release service and its watcher."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.store.release_record import Canary, Release


@dataclass
class ActiveReleases:
    """This replica's view of each model's active release (kept fresh by ReleaseWatcher)."""

    records: dict[str, Release] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    canaries: dict[str, Canary] = field(default_factory=dict)
    canary_records: dict[str, Release] = field(default_factory=dict)  # the canary's candidate
    # What the last verification found wrong with each active release's checkpoint (/readyz).
    checkpoint_problems: dict[str, list[str]] = field(default_factory=dict)
