"""The litellm adapter behind the same backend seam: a deployment of `kind: litellm` serves a
request end to end (here litellm's OpenAI provider pointed at the simulated backend)."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from testkit.procs import gateway_config, running_gateway

# Looked up, not imported: litellm takes seconds to import, in every process that collects the tests
# (the gateway imports it only when a deployment needs it).
if importlib.util.find_spec("litellm") is None:
    pytest.skip("litellm is the optional [litellm] extra (installed by [dev])", allow_module_level=True)


def test_litellm_deployment_streams_the_same_text_as_the_backend(sims: list[Announced], tmp_path: Path) -> None:
    sim = sims[0]  # `sims` resets the shared sims' faults left by earlier tests
    via_litellm = {
        "name": "through-litellm",
        "kind": "litellm",
        "api_base": f"{sim.url}/v1",
        "api_key": "not-needed",
        "model": "openai/sim-model",  # litellm's provider prefix; the sim sees model "sim-model"
        "timeouts": {"connect_s": 5, "first_token_s": 30, "stall_s": 10},
    }
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "through litellm"}], "max_tokens": 6}
    direct = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10).json()
    with running_gateway(tmp_path, gateway_config(via_litellm)) as gateway:
        plain = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=60)
        streamed = httpx.post(
            f"{gateway.url}/v1/chat/completions", json={**body, "stream": True}, headers=gateway.headers(), timeout=60
        )
    assert plain.status_code == 200, plain.text
    assert plain.json()["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert plain.json()["usage"]["completion_tokens"] == 6
    assert streamed.text.endswith("data: [DONE]\n\n")


def test_litellm_errors_are_upstream_errors_not_500(sims: list[Announced], tmp_path: Path) -> None:
    """litellm's exceptions do not share the base class litellm exports: each is translated."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unreachable = {
        "name": "nowhere",
        "kind": "litellm",
        "api_base": f"http://127.0.0.1:{closed}/v1",
        "api_key": "not-needed",
        "model": "openai/sim-model",
        "timeouts": {"connect_s": 2, "first_token_s": 10, "stall_s": 5},
    }
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with running_gateway(tmp_path, gateway_config(unreachable, routing={"retry": {"max_attempts": 1}})) as gateway:
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=60)
    assert reply.status_code in (502, 503, 504), reply.text
    assert "None" not in reply.json()["error"]["message"]
