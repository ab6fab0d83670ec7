"""What the audit log must hold besides requests: tools stripped or denied, approvals expiring,
refused self-approvals, policy reloads (and rejected ones)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, audit_records, deployment, gateway_config, policy_file, running_gateway
from tests.e2e.test_tool_policy import POLICY, SECRET, ask


@pytest.fixture
def gateway(sim_pair: list[Announced], tmp_path: Path) -> Iterator[Gateway]:
    tools = {"policy_file": policy_file(tmp_path, POLICY), "approval_secret": SECRET, "reload_interval_s": 60}
    with running_gateway(tmp_path, gateway_config(deployment("a", sim_pair[0]), tools=tools)) as running:
        yield running


def audited(gateway: Gateway, kind: str, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first audit record of `kind` matching `wanted` (the writer flushes in the background)."""
    records = audit_records(gateway, kind, lambda found: any(map(wanted, found)), within_s=10)
    found = [r for r in records if wanted(r)]
    assert found, f"no {kind} audit record as wanted among {records}"
    return found[0]


def test_stripped_and_denied_tools_are_audited(gateway: Gateway) -> None:
    assert ask(gateway, gateway.key, "get_weather", "delete_everything").status_code == 200
    stripped = audited(gateway, "policy", lambda r: r["decision"] == "strip")
    assert stripped["tool"] == "delete_everything"
    assert ask(gateway, gateway.key, "get_weather", "delete_everything", choose="delete_everything").status_code == 403
    denied = audited(gateway, "policy", lambda r: r["decision"] == "deny" and r["code"] == "tool_choice")
    assert denied["tool"] == "delete_everything"


def test_expiry_and_refused_self_approval_are_audited(gateway: Gateway) -> None:
    _, hasty = gateway.create_key(tenant="hastyco")
    expired_id = ask(gateway, hasty, "refund_payment", choose="refund_payment").headers["X-Approval-Id"]
    expired = audited(gateway, "admin", lambda r: r["action"] == "approval.expired")
    assert expired["target"] == expired_id

    _, both = gateway.create_key(scopes=["chat", "approver"])
    approval_id = ask(gateway, both, "send_email", choose="send_email").headers["X-Approval-Id"]
    url = f"{gateway.url}/admin/approvals/{approval_id}/approve"
    assert httpx.post(url, headers=gateway.headers(both), timeout=10).status_code == 403
    refused = audited(gateway, "admin", lambda r: r["action"] == "approval.self_approval_refused")
    assert refused["target"] == approval_id


def test_policy_reloads_and_rejected_reloads_are_audited(gateway: Gateway, tmp_path: Path) -> None:
    path = Path(yaml_path(gateway))
    reload_url = f"{gateway.url}/admin/policies/reload"
    admin = gateway.headers(gateway.admin_key)
    assert httpx.post(reload_url, headers=admin, timeout=10).status_code == 200
    audited(gateway, "admin", lambda r: r["action"] == "policy.reload")
    path.write_text("policies:\n  agent:\n    tools: [{name: get_weather, risk: extreme}]\n")
    assert httpx.post(reload_url, headers=admin, timeout=10).status_code == 400
    rejected = audited(gateway, "admin", lambda r: r["action"] == "policy.reload_rejected")
    assert "risk" in rejected["reason"]


def yaml_path(gateway: Gateway) -> str:
    import yaml

    return str(yaml.safe_load(gateway.config_path.read_text())["tools"]["policy_file"])
