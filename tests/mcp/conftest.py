"""An MCP tool server (the SDK's server API), and a gateway with it upstream over Streamable HTTP
and again over stdio (a process the gateway starts and supervises)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.processes import Announced, start_announcing
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway

SECRET = "mcp-test-approval-secret-0123456789"
POLICY = """
policies:
  agent:
    approval: {mode: wait, timeout_s: 20, ttl_s: 600}
    tools:
      - {name: files__read_file, risk: low}
      - name: files__delete_file
        risk: high
        arguments:
          type: object
          properties: {path: {type: string, pattern: "^/tmp/"}}
          required: [path]
      - {name: local__read_file, risk: low}
      - {name: local__slow_echo, risk: low}
      - {name: files__big, risk: low}
      - {name: hasty__slow_echo, risk: low}
  impatient:
    approval: {mode: wait, timeout_s: 1, ttl_s: 600}
    tools: [{name: files__delete_file, risk: high}]
  operator:
    approval: {mode: wait, timeout_s: 20, ttl_s: 600}
    tools: [{name: files__delete_file, risk: high}]
bindings:
  tenants: {acme: agent, hastyco: impatient, opsco: operator}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Announced]:
    server = start_announcing(
        ["testkit.mcp_upstream", "--http"], env={"AGW_APPROVAL_SECRET": SECRET, "AGW_NAMESPACE": "files"}
    )
    try:
        yield server
    finally:
        server.stop()


def mcp_config(upstream: Announced, tmp_path: Path, sim: Announced, **mcp: object) -> dict[str, object]:
    stdio = [sys.executable, "-m", "testkit.mcp_upstream", "--stdio"]
    servers = [
        {"name": "files", "url": upstream.url, "call_timeout_s": 10},
        {"name": "local", "command": stdio, "env": {"AGW_NAMESPACE": "local"}, "call_timeout_s": 10},
        {"name": "hasty", "url": upstream.url, "call_timeout_s": 1},  # the same server, less patience
    ]
    return gateway_config(
        deployment("a", sim),
        tools={"policy_file": policy_file(tmp_path, POLICY), "approval_secret": SECRET},
        mcp={"servers": servers, "progress_interval_s": 0.2, "max_result_bytes": 4096, **mcp},
    )


@pytest.fixture(scope="module")
def gateway(upstream: Announced, echo_sim: Announced, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp_path = tmp_path_factory.mktemp("mcp-gateway")
    with running_gateway(tmp_path, mcp_config(upstream, tmp_path, echo_sim)) as running:
        yield running
