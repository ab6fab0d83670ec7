"""The checkout's own packages point one way: the benchmarks and the test support never use the
tests (bench/ imports testkit/, as the tests do), so a benchmark runs from a checkout without its
test suite and a test can be moved without breaking a benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    """The modules a file imports (inside functions too) or runs with `python -m`."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tests."):
            found.add(node.value)  # a module started as a process: [sys.executable, "-m", "tests.x"]
    return found


@pytest.mark.parametrize("package", ["bench", "testkit"])
def test_the_benchmarks_and_the_test_support_import_nothing_of_the_tests(package: str) -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(m for m in imports_of(path) if m == "tests" or m.startswith("tests."))
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: modules for path, modules in offending.items() if modules} == {}
