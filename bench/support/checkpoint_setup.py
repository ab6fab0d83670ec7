"""The gateways of the checkpoint-cost benchmark, and what each leaves in its store.

Four gateways over one fast upstream: {embedded, Redis} x {sessions on, sessions off}. Each has
its own store (a scratch directory, or its own Redis key prefix), so the sessions one writes are
counted per gateway afterwards: a "sessions on" gateway that checkpointed nothing would make the
comparison meaningless. Redis is reached through `redis-cli` (SCAN and DEL), so that nothing here
imports the client library the gateway keeps to its store package.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.support.procs import Service
from bench.support.services import gateway_config, serve_gateway

REDIS_URL = "redis://127.0.0.1:6379/0"
_DEL_BATCH = 500
_MAX_KEYS = 5_000_000  # a bound on what cleanup will scan


@dataclass(frozen=True)
class Variant:
    """One gateway under test."""

    store: str  # embedded | redis
    sessions: bool
    redis_prefix: str = ""

    @property
    def name(self) -> str:
        return f"{self.store} sessions {'on' if self.sessions else 'off'}"

    @property
    def slug(self) -> str:
        return f"{self.store}-{'on' if self.sessions else 'off'}"


def _store_yaml(variant: Variant, data_dir: Path) -> str:
    if variant.store == "redis":
        return f"{{kind: redis, url: {REDIS_URL}, key_prefix: {variant.redis_prefix}}}"
    return f"{{kind: embedded, path: {data_dir}}}"


def data_dir(workdir: Path, variant: Variant) -> Path:
    return workdir / f"data-{variant.slug}"


def start_variant(workdir: Path, variant: Variant, upstream_url: str, admin_key: str) -> Service:
    # Sessions keep their defaults (16 events / 100 ms) when on; only `enabled` differs.
    store = _store_yaml(variant, data_dir(workdir, variant))
    config = gateway_config(upstream_url, data_dir(workdir, variant), store, variant.sessions)
    return serve_gateway(workdir, config, admin_key, name=variant.name, stem=f"gateway-{variant.slug}")


def _redis_cli(*args: str, timeout_s: float = 30) -> str:
    result = subprocess.run(
        ["redis-cli", "-u", REDIS_URL, *args], capture_output=True, text=True, timeout=timeout_s, check=True
    )
    return result.stdout


def redis_problem() -> str:
    """Why Redis cannot be used, or "" when it can."""
    if shutil.which("redis-cli") is None:
        return "redis-cli is not installed"
    try:
        reply = _redis_cli("PING", timeout_s=5).strip()
    except (subprocess.SubprocessError, OSError) as exc:
        return f"redis-cli PING failed: {exc}"
    return "" if reply == "PONG" else f"Redis at {REDIS_URL} answered {reply!r} to PING"


def redis_keys(pattern: str) -> list[str]:
    """SCAN (not KEYS): the server never blocks on a large keyspace."""
    output = _redis_cli("--scan", "--pattern", pattern, timeout_s=120)
    return [k for k in output.splitlines() if k][:_MAX_KEYS]


def delete_redis_keys(keys: list[str]) -> int:
    deleted = 0
    for start in range(0, len(keys), _DEL_BATCH):
        deleted += int(_redis_cli("DEL", *keys[start : start + _DEL_BATCH]).strip() or 0)
    return deleted


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def session_count(workdir: Path, variant: Variant) -> int:
    """Sessions the gateway checkpointed: Redis session state keys, or rows of the SQLite table."""
    if variant.store == "redis":
        return len(redis_keys(_glob_escape(variant.redis_prefix) + ":{s:*:state"))
    path = data_dir(workdir, variant) / "gateway.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        try:
            return int(db.execute("SELECT count(*) FROM sessions WHERE state IS NOT NULL").fetchone()[0])
        except sqlite3.OperationalError:
            return 0  # no sessions table: nothing was ever checkpointed
