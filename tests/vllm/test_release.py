"""Release switch and rollback on real weights: two checkpoints of one training run (saved by
`save_checkpoint`, registered), each served by its own vLLM engine. Promote v1, promote v2, roll
back in one call: each answer comes from the weights of the active release, the release records
what every deployment reports it serves (vLLM's /v1/models `root`), and a release pinning a
checkpoint its deployment does not serve is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.procs import GatewayProcess, gateway_process
from tests.vllm.client import MODEL, admin, vllm_deployment, vllm_gateway_config
from tests.vllm.conftest import Checkpoints, Pool

# Engine starts and the model build happen in the first test's fixtures: minutes, not seconds.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

QUESTION = "Which checkpoint are you?"
ANSWERS = {"v1": "I am checkpoint one, the first release.", "v2": "I am checkpoint TWO; release 2 speaking!"}


def ask(gateway: GatewayProcess) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 60, "temperature": 0}
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def test_promote_refuse_mismatch_and_roll_back_on_real_weights(
    pool: Pool, checkpoints: Checkpoints, tmp_path: Path, figures: dict[str, Any]
) -> None:
    v1, v2 = pool.ready("b", "c")  # b serves tiny@200, c serves tiny@300
    served = {
        name: httpx.get(f"{s.url}/v1/models", timeout=10).json()["data"][0]["root"]
        for name, s in (("b", v1), ("c", v2))
    }
    assert served == {"b": str(checkpoints.paths["v1"]), "c": str(checkpoints.paths["v2"])}
    config = vllm_gateway_config(
        vllm_deployment("b", v1),
        vllm_deployment("c", v2, priority=1),
        releases={"checkpoint_registry": str(checkpoints.registry.root), "watch_interval_s": 0.1},
    )
    with gateway_process(tmp_path, config) as gateway:
        specs = [
            {"version": "1", "deployments": ["b"], "checkpoint": checkpoints.versions["v1"]},
            {"version": "2", "deployments": ["c"], "checkpoint": checkpoints.versions["v2"]},
            # Pins v2's weights on the engine that serves v1's: must never go live.
            {"version": "2-wrong", "deployments": ["b"], "checkpoint": checkpoints.versions["v2"]},
        ]
        for spec in specs:
            created = admin(gateway, "releases", spec)
            assert created.status_code == 201, created.text

        promoted = admin(gateway, "promote", {"version": "1"})
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["serving"] == {"b": served["b"]}
        assert ask(gateway) == ANSWERS["v1"]

        refused = admin(gateway, "promote", {"version": "2-wrong"})
        assert refused.status_code == 409, refused.text
        assert "deployment b serves" in refused.json()["error"]["message"]
        assert "tiny/step-200" in refused.json()["error"]["message"]
        assert ask(gateway) == ANSWERS["v1"], "the refused release changed nothing"

        promoted = admin(gateway, "promote", {"version": "2", "reason": "new checkpoint"})
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["serving"] == {"c": served["c"]}
        assert ask(gateway) == ANSWERS["v2"]

        rolled = admin(gateway, "rollback", {"reason": "back to v1"})
        assert rolled.status_code == 200, rolled.text
        assert (rolled.json()["active"], rolled.json()["serving"]) == ("1", {"b": served["b"]})
        assert ask(gateway) == ANSWERS["v1"]

        audit = httpx.get(
            f"{gateway.url}/admin/audit",
            params={"kind": "admin"},
            headers=gateway.headers(gateway.admin_key),
            timeout=10,
        ).json()["data"]
        switches = [r for r in audit if r.get("action") in ("release.promote", "release.rollback")]
        assert [r["after"] for r in switches] == [
            {"active": "1", "serving": {"b": served["b"]}},
            {"active": "2", "serving": {"c": served["c"]}},
            {"active": "1", "serving": {"b": served["b"]}},
        ]
