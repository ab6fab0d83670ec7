"""Which code a benchmark measured: the commit, and the files changed on top of it.

The working tree is shared with people editing the gateway, so a figure belongs to the commit
plus whatever was uncommitted at the time; the results say so rather than pretend otherwise.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def _git(repo: Path, *args: str) -> str:
    try:
        result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True)
    except (subprocess.SubprocessError, OSError):
        return ""
    return result.stdout


def source_info(repo: Path) -> dict[str, Any]:
    changed = [line[3:] for line in _git(repo, "status", "--porcelain", "--", "gateway").splitlines()]
    return {"commit": _git(repo, "rev-parse", "HEAD").strip() or None, "gateway_files_changed": changed}


def describe(info: dict[str, Any]) -> str:
    commit = (info.get("commit") or "unknown")[:12]
    changed = info.get("gateway_files_changed") or []
    return f"commit {commit}" + (f" + {len(changed)} uncommitted file(s) under gateway/" if changed else "")
