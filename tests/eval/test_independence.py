from __future__ import annotations

import ast
from pathlib import Path

EVAL_DIR = Path(__file__).resolve().parents[2] / "eval"


def test_eval_package_never_imports_gateway() -> None:
    offenders = []
    for path in EVAL_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0] == "gateway"]
    assert offenders == []
