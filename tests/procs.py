"""Real processes for end-to-end tests: simulated backends and gateways on 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.cli.processes import Announced, start_announcing

FAST_SIM = ["--ttft-ms", "5", "--tpot-ms", "1", "--jitter", "0"]


def start_sim(*extra: str) -> Announced:
    return start_announcing(["gateway.sim", "--port", "0", *FAST_SIM, *extra])


def set_faults(sim: Announced, **faults: Any) -> None:
    httpx.put(f"{sim.url}/sim/control/faults", json=faults, timeout=5).raise_for_status()


def reset(sim: Announced) -> None:
    httpx.post(f"{sim.url}/sim/control/reset", timeout=5).raise_for_status()


def served_count(sim: Announced) -> int:
    control = httpx.get(f"{sim.url}/sim/control", timeout=5).json()
    return int(control["counters"]["requests"])


def deployment(name: str, sim: Announced, **overrides: Any) -> dict[str, Any]:
    return {
        "name": name,
        "api_base": f"{sim.url}/v1",
        "model": "sim-model",
        "continuation": "vllm",
        "timeouts": {"connect_s": 1, "first_token_s": 2, "stall_s": 1},
        **overrides,
    }


def gateway_config(*deployments: dict[str, Any], **sections: Any) -> dict[str, Any]:
    routing = {"retry": {"backoff_base_s": 0.01}, "health": {"interval_s": 30}, **sections.pop("routing", {})}
    return {
        "routing": routing,
        "models": [{"name": "sim-model", "deployments": list(deployments)}],
        **sections,
    }


@contextlib.contextmanager
def running_gateway(tmp_path: Path, config: dict[str, Any]) -> Iterator[Announced]:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = start_announcing(["gateway", "serve", "--config", str(path), "--port", "0"])
    try:
        yield gateway
    finally:
        gateway.stop()
