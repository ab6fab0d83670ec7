"""RequestContext's fields each have one writer: the sections of its definition in
gateway/pipeline.py name them, and this test holds the code to it.

It sees the writes the code makes through the name `ctx` (every stage's name for the context):
assigning, augmenting, unpacking into, setting a key of, or calling a mutating method on a field.
A write through another name (an alias, a field's own attributes) is out of its sight; review
keeps those to the owner too."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from gateway.pipeline import RequestContext

GATEWAY = Path(__file__).resolve().parents[1] / "gateway"

# Field -> the modules that may write it (assign, augment, append to, set a key of) through `ctx`.
WRITERS: dict[str, set[str]] = {
    "model": {"http/requests.py"},
    "stream": {"http/requests.py"},
    "include_usage": {"http/requests.py"},
    "echo": {"http/requests.py", "sessions/stage.py"},  # AppendHistory: store false when nothing is kept
    "continuity": {"http/requests.py"},
    "operation": {"http/requests.py"},
    "conversation": {"sessions/stage.py"},
    "kept_items": {"sessions/stage.py"},
    # Shared on purpose, rewritten in stage order (see RequestContext's docstring).
    "body": {
        "http/requests.py",
        "sessions/stage.py",
        "releases/stage.py",
        "approvals/tool_policy.py",
        "quota/stage.py",
    },
    "trace": {"telemetry/stage.py"},
    "principal": {"auth/stage.py"},
    "session_id": {"sessions/stage.py"},
    "session_owner": {"sessions/stage.py"},
    "session_shared": {"sessions/stage.py"},
    "keep_transcript": {"sessions/stage.py"},
    "session_new": {"sessions/stage.py"},
    "session_unresumable": {"sessions/stage.py"},
    "estimated_prompt_tokens": {"quota/stage.py"},
    "quota_note": {"quota/stage.py"},
    "quota_hold": {"quota/stage.py"},
    "charged_tokens": {"quota/stage.py"},
    "release": {"releases/stage.py"},
    "deployments": {"releases/stage.py"},
    "release_fallback": {"releases/stage.py"},
    "release_prompt": {"releases/stage.py"},
    "canary_failed": {"releases/stage.py"},
    "approval_keepalive_s": {"approvals/tool_policy.py"},
    "usage": {"pipeline.py"},
    "ttft_s": {"pipeline.py"},
    "relayed_tokens": {"pipeline.py"},
    "completion_text": {"audit/stage.py"},
    # Shared on purpose: each stage adds its own headers.
    "response_headers": {"quota/stage.py", "sessions/stage.py", "releases/stage.py", "approvals/tool_policy.py"},
}
MUTATORS = {"append", "extend", "update", "clear", "pop", "setdefault", "insert", "remove"}


def _written_fields(node: ast.AST) -> list[str]:
    """The ctx fields `node` writes through `ctx` (ctx.f = / ctx.f += / a, ctx.f = / ctx.f[k] = /
    ctx.f.append(...))."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            targets += target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
        targets = [t.value if isinstance(t, ast.Subscript) else t for t in targets]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        targets = [node.func.value]
    return [t.attr for t in targets if isinstance(t, ast.Attribute) and _ctx_attribute(t)]


def _ctx_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx"


def writes_in_gateway() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        module = path.relative_to(GATEWAY).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in _written_fields(node):
                found.setdefault(name, set()).add(module)
    return found


def test_every_request_context_field_is_written_only_by_its_owner() -> None:
    strays = {
        name: sorted(modules - WRITERS.get(name, set()))
        for name, modules in writes_in_gateway().items()
        if modules - WRITERS.get(name, set())
    }
    assert strays == {}, f"written outside their owners (see RequestContext in gateway/pipeline.py): {strays}"


def test_the_owner_table_names_only_fields_that_exist() -> None:
    assert set(WRITERS) <= {f.name for f in fields(RequestContext)}


def test_the_scan_sees_each_kind_of_write() -> None:
    source = "ctx.a = 1\nctx.b += 1\nctx.c['k'] = 1\nctx.d.append(1)\nctx.e.update({})\nother.f = 1\nctx.g.h = 1\n"
    source += "x, ctx.i = 1, 2\n[ctx.j, ctx.k] = 1, 2\n"
    seen = {name for node in ast.walk(ast.parse(source)) for name in _written_fields(node)}
    assert seen == {"a", "b", "c", "d", "e", "i", "j", "k"}
