"""The replay tool is an HTTP client of the gateway: it must never import the code it measures."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.replay.conftest import REPO_ROOT


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_replay_package_never_imports_gateway() -> None:
    sources = sorted((REPO_ROOT / "replay").glob("**/*.py"))
    assert sources
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(m for m in imported_modules(path) if m.split(".")[0] == "gateway")
        for path in sources
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_cli_shim_imports_only_the_replay_package() -> None:
    modules = imported_modules(REPO_ROOT / "gateway" / "cli" / "replay.py")
    assert {m.split(".")[0] for m in modules} <= {"__future__", "click", "replay"}
