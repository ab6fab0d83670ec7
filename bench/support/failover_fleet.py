"""The processes of the failover drill: two simulated backends and a gateway that routes over them.

The primary (priority 0) is the one that fails; the fallback (priority 1) continues the answer.
Both can continue a partial answer (`continuation: vllm`). The breaker threshold is set out of
reach and health probes are rare, so that a hundred deliberate failures never take the primary
out of rotation: every drill must start on the primary, or it measures nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.support.procs import Service, start_announcing
from bench.support.services import REPO_DIR
from common.processes import ProcessStartError

_CONTROL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SimTiming:
    ttft_ms: float
    tpot_ms: float


def sim_argv(port: int, timing: SimTiming) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sim",
        "--port",
        str(port),
        "--ttft-ms",
        f"{timing.ttft_ms:g}",
        "--tpot-ms",
        f"{timing.tpot_ms:g}",
        "--jitter",
        "0",
    ]


def start_sim(workdir: Path, name: str, timing: SimTiming, port: int = 0) -> Service:
    argv = sim_argv(port, timing)
    return start_announcing(name, argv, workdir / f"{name}.log", REPO_DIR, {}, timeout_s=30)


def port_of(service: Service) -> int:
    port = urlsplit(service.url).port
    if port is None:
        raise ProcessStartError(f"{service.name} has no port in {service.url}")
    return port


def kill_now(service: Service) -> None:
    """SIGKILL, no waiting: the caller timestamps the moment; `reap` collects the process later."""
    os.kill(service.process.pid, signal.SIGKILL)


def reap(service: Service) -> None:
    service.process.wait(10)


def set_faults(service: Service, **faults: Any) -> None:
    reply = httpx.put(f"{service.url}/sim/control/faults", json=faults, timeout=_CONTROL_TIMEOUT_S)
    reply.raise_for_status()


def gateway_yaml(primary: Service, fallback: Service, stall_s: float, data_dir: Path) -> str:
    timeouts = f"{{connect_s: 1, first_token_s: 5, stall_s: {stall_s:g}}}"
    common = f"model: sim-model, continuation: vllm, max_inflight: 64, timeouts: {timeouts}"
    return f"""\
store: {{kind: embedded, path: {data_dir}}}
routing:
  health: {{interval_s: 600}}
  breaker: {{failure_threshold: 1000000, cooldown_s: 1}}
  retry: {{backoff_base_s: 0.01}}
models:
  - name: sim-model
    deployments:
      - {{name: primary, api_base: "{primary.url}/v1", priority: 0, {common}}}
      - {{name: fallback, api_base: "{fallback.url}/v1", priority: 1, {common}}}
"""


def fetch_audit(gateway_url: str, admin_key: str, max_pages: int = 20) -> dict[str, dict[str, Any]]:
    """Every request record of the audit log, by request id (bounded: `max_pages` of 10,000)."""
    found: dict[str, dict[str, Any]] = {}
    after = 0
    headers = {"Authorization": f"Bearer {admin_key}"}
    for _ in range(max_pages):
        params: dict[str, str | int] = {"kind": "request", "after_seq": after, "limit": 10_000}
        reply = httpx.get(f"{gateway_url}/admin/audit", params=params, headers=headers, timeout=30)
        reply.raise_for_status()
        page = reply.json()
        found |= {r["request_id"]: r for r in page["data"]}
        if page["next_after_seq"] is None:
            break
        after = page["next_after_seq"]
    return found
