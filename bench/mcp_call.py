"""What the gateway adds to an MCP tool call: direct to an MCP server vs through the gateway.

    python -m bench.mcp_call [--calls 300] [--rounds 3]

One run starts the test suite's MCP server (Streamable HTTP, stateless) and a gateway in front of
it with a policy that allows its read-only tool, then times `tools/call` with the official SDK
client, one call at a time over one session, alternating direct and through-the-gateway rounds.
The gateway path includes authentication, the policy decision and the audit record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bench.support.harness import cell, command_report_line, machine_line, markdown
from bench.support.procs import running, start_announcing
from bench.support.services import REPO_DIR, serve_gateway, start_keyed_gateway

POLICY = """
policies:
  bench: {tools: [{name: files__read_file, risk: low}]}
bindings: {tenants: {bench: bench}}
"""


def gateway_config(workdir: Path, upstream_url: str) -> str:
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    return f"""\
store: {{kind: embedded, path: {workdir / "data"}}}
routing: {{health: {{interval_s: 60}}}}
models: [{{name: m, deployments: [{{name: d, api_base: {upstream_url}/v1, model: m}}]}}]
tools: {{policy_file: {policy}}}
mcp: {{servers: [{{name: files, url: {upstream_url}}}]}}
"""


async def time_calls(url: str, headers: dict[str, str], tool: str, calls: int) -> list[float]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10, read=60)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for _ in range(20):  # warm-up: connections, caches
            await session.call_tool(tool, {"path": "/srv/x"})
        took = []
        for _ in range(calls):
            started = time.perf_counter()
            result = await session.call_tool(tool, {"path": "/srv/x"})
            took.append(time.perf_counter() - started)
            if result.is_error:
                raise RuntimeError(f"{tool} failed: {result.content}")
        return took


async def measure(upstream_url: str, gateway_url: str, key: str, calls: int, rounds: int) -> dict[str, list[float]]:
    paths = {
        "direct": (upstream_url, {}, "read_file"),
        "gateway": (f"{gateway_url}/mcp", {"Authorization": f"Bearer {key}"}, "files__read_file"),
    }
    medians: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, (url, headers, tool) in paths.items():
            took = await time_calls(url, headers, tool, calls)
            medians[name].append(statistics.median(took) * 1000)
            print(f"  {name:<8} p50 {medians[name][-1]:.3f} ms", file=sys.stderr, flush=True)
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="timed calls per round and path")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the report takes the median")
    args = parser.parse_args()
    started = time.monotonic()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        upstream = stack.enter_context(
            running(
                start_announcing(
                    "mcp-server",
                    [sys.executable, "-m", "testkit.mcp_upstream", "--http"],
                    workdir / "upstream.log",
                    REPO_DIR,
                    {},
                    timeout_s=30,
                )
            )
        )
        upstream_url = upstream.url
        # The key is of tenant "bench", which the policy binds.
        gateway, key = start_keyed_gateway(
            stack, lambda admin_key: serve_gateway(workdir, gateway_config(workdir, upstream_url), admin_key)
        )
        medians = asyncio.run(measure(upstream_url, gateway.url, key, args.calls, args.rounds))
    direct, through = statistics.median(medians["direct"]), statistics.median(medians["gateway"])
    rows = [
        ["direct to the MCP server", cell(direct, 3)],
        ["through the gateway", cell(through, 3)],
        ["added by the gateway", cell(through - direct, 3)],
    ]
    print(f"\n## MCP tools/call latency (p50 ms, median of {args.rounds} rounds of {args.calls} calls)\n")
    print(markdown(["path", "p50 ms"], rows))
    print(machine_line(load))
    print(command_report_line("bench.mcp_call", time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
