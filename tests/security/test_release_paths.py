"""Issue 11, Low: admin `eval_set` / `smoke_samples` accepted any server path: a file-existence
oracle, and a YAML error echoed the line it failed on (a password line). Paths named through the
admin API must lie under `releases.file_roots` (symlinks and `..` resolved), the refusal reads the
same whether or not the file exists, and no error carries file content."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway

SECRET = "hunter2-do-not-echo"


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("release-paths")
    allowed, outside = base / "allowed", base / "outside"
    allowed.mkdir()
    outside.mkdir()
    (outside / "secret.yaml").write_text(f"password: {SECRET}\n")
    (allowed / "broken.yaml").write_text(f"id: x\npassword: {SECRET}\n  bad: [\n")
    (allowed / "link.yaml").symlink_to(outside / "secret.yaml")
    (allowed / "samples.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    return {"base": base, "allowed": allowed, "outside": outside}


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], roots: dict[str, Path]) -> Iterator[Gateway]:
    config = gateway_config(deployment("a", sim_pair[0]), releases={"file_roots": [str(roots["allowed"])]})
    with running_gateway(roots["base"], config) as running:
        yield running


def create(gateway: Gateway, version: str, **fields: Any) -> httpx.Response:
    body = {"version": version, **fields}
    return httpx.post(
        f"{gateway.url}/admin/models/sim-model/releases",
        json=body,
        headers=gateway.headers(gateway.admin_key),
        timeout=30,
    )


@pytest.mark.parametrize("field", ["eval_set", "smoke_samples"])
def test_path_outside_the_roots_is_refused_without_an_existence_oracle(
    gateway: Gateway, roots: dict[str, Path], field: str
) -> None:
    outside = roots["outside"]
    replies = {
        "exists": create(gateway, "a1", **{field: str(outside / "secret.yaml")}),
        "missing": create(gateway, "a2", **{field: str(outside / "nope.yaml")}),
        "dotdot": create(gateway, "a3", **{field: str(roots["allowed"] / ".." / "outside" / "secret.yaml")}),
        "symlink": create(gateway, "a4", **{field: str(roots["allowed"] / "link.yaml")}),
        "system": create(gateway, "a5", **{field: "/etc/passwd"}),
    }
    messages = set()
    for case, reply in replies.items():
        assert reply.status_code == 400, (case, reply.text)
        assert reply.json()["error"]["param"] == field
        assert SECRET not in reply.text
        messages.add(reply.json()["error"]["message"])
    assert len(messages) == 1, messages  # the same words whether or not the file exists


def test_yaml_error_does_not_echo_file_content(gateway: Gateway, roots: dict[str, Path]) -> None:
    reply = create(gateway, "b1", eval_set=str(roots["allowed"] / "broken.yaml"))
    assert reply.status_code == 400, reply.text
    assert SECRET not in reply.text
    assert "line 3" in reply.json()["error"]["message"]


def test_file_under_a_root_is_accepted(gateway: Gateway, roots: dict[str, Path]) -> None:
    assert create(gateway, "c1", smoke_samples=str(roots["allowed"] / "samples.jsonl")).status_code == 201


def test_without_file_roots_the_api_names_no_files(sim_pair: list[Announced], tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with running_gateway(tmp_path, gateway_config(deployment("a", sim_pair[0]))) as gateway:
        reply = create(gateway, "d1", smoke_samples=str(samples))
    assert reply.status_code == 400
    assert "releases.file_roots" in reply.json()["error"]["message"]
