"""Release switch and rollback with LoRA adapters on one vLLM engine (`--enable-lora`): two adapters
registered as checkpoints, one deployment addressing them under one adapter name with a `lora` load
hook. The adapter loaded under that name is what clients get, so loading it is the switch: the
operator loads the new adapter and promotes (the promotion checks vLLM serves the pinned one, and
refuses otherwise); a rollback loads the old adapter itself, in one call, before switching back."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import httpx
import pytest

from checkpoints.training import save_checkpoint
from testkit.procs import GatewayProcess, gateway_process
from tests.vllm.client import MODEL, admin, vllm_deployment, vllm_gateway_config
from tests.vllm.conftest import Checkpoints, Pool
from tests.vllm.lora import write_adapter
from tests.vllm.servers import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

ADAPTER = "tiny-ft"  # the name clients address (the deployment's model)
QUESTION = "Which checkpoint are you?"
SCALE = 0.15  # large enough to change the greedy answer, small enough to keep it text-like


def chat(url: str, model: str, headers: dict[str, str] | None = None) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 40, "temperature": 0}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def ask(gateway: GatewayProcess) -> str:
    return chat(gateway.url, MODEL, gateway.headers())


def load(engine: VllmServer, name: str, path: Path, inplace: bool = False) -> None:
    body = {"lora_name": name, "lora_path": str(path), "load_inplace": inplace}
    reply = httpx.post(f"{engine.url}/v1/load_lora_adapter", json=body, timeout=120)
    assert reply.status_code == 200, reply.text


def served(engine: VllmServer) -> dict[str, str]:
    return {m["id"]: m["root"] for m in httpx.get(f"{engine.url}/v1/models", timeout=10).json()["data"]}


def register_adapters(checkpoints: Checkpoints, base: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """label -> (registered directory, registry version) of two adapters with different weights."""
    adapters = {}
    for step, label in ((1, "v1"), (2, "v2")):
        writer = functools.partial(write_adapter, base_model=base, seed=step, scale=SCALE)
        saved = save_checkpoint({}, root, "tiny-lora", step, writer=writer, registry=checkpoints.registry)
        result = saved.result(timeout=60)
        assert result.entry is not None
        assert result.entry.format == "lora-adapter"
        adapters[label] = (result.path, result.version)
    return adapters


def test_a_rollback_loads_the_old_adapter_on_one_lora_engine_and_answers_from_it(
    pool: Pool, checkpoints: Checkpoints, tmp_path: Path, figures: dict[str, Any]
) -> None:
    (engine,) = pool.ready("c")  # tiny@300 with --enable-lora
    adapters = register_adapters(checkpoints, checkpoints.paths["v2"], tmp_path / "runs")
    # References: each adapter asked directly, under a name of its own.
    for label, (path, _) in adapters.items():
        load(engine, f"ref-{label}", path)
    expected = {label: chat(engine.url, f"ref-{label}") for label in adapters}
    base = chat(engine.url, "tiny")
    figures["lora_answers"] = {"base": base, **expected}
    assert len({base, expected["v1"], expected["v2"]}) == 3, "the adapters must change the greedy answer"

    hook = {"kind": "lora", "lora_name": ADAPTER, "timeout_s": 60}
    config = vllm_gateway_config(
        vllm_deployment("ft", engine, model=ADAPTER, load_hook=hook),
        releases={"checkpoint_registry": str(checkpoints.registry.root), "watch_interval_s": 0.1},
    )
    load(engine, ADAPTER, adapters["v1"][0])  # the operator deploys v1's adapter
    with gateway_process(tmp_path, config) as gateway:
        for version, (_, checkpoint) in adapters.items():
            created = admin(gateway, "releases", {"version": version, "deployments": ["ft"], "checkpoint": checkpoint})
            assert created.status_code == 201, created.text
        promoted = admin(gateway, "promote", {"version": "v1"})
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["serving"] == {"ft": str(adapters["v1"][0])}
        assert ask(gateway) == expected["v1"]

        # v2 pinned while the engine still serves v1's adapter under the name: refused.
        refused = admin(gateway, "promote", {"version": "v2"})
        assert refused.status_code == 409, refused.text
        assert "deployment ft serves" in refused.json()["error"]["message"]
        assert "tiny-lora/step-1" in refused.json()["error"]["message"]
        assert ask(gateway) == expected["v1"], "the refused release changed nothing"

        load(engine, ADAPTER, adapters["v2"][0], inplace=True)  # the operator deploys v2's adapter
        promoted = admin(gateway, "promote", {"version": "v2", "reason": "new adapter"})
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["serving"] == {"ft": str(adapters["v2"][0])}
        assert ask(gateway) == expected["v2"]

        rolled = admin(gateway, "rollback", {"reason": "back to v1"})  # the hook loads v1's adapter
        assert rolled.status_code == 200, rolled.text
        assert (rolled.json()["active"], rolled.json()["serving"]) == ("v1", {"ft": str(adapters["v1"][0])})
        assert rolled.json()["post_check"] == "ok"
        assert served(engine)[ADAPTER] == str(adapters["v1"][0])
        assert ask(gateway) == expected["v1"]
