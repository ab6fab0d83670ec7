"""A command load hook runs detached from the gateway: its own session, no inherited
descriptors, and its output in a file the gateway's log names."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from gateway.releases.load_hooks import bring_up
from gateway.settings import DeploymentSettings, LoadHook, LoadHookKind


def test_a_command_hook_gets_its_own_session_no_inherited_socket_and_its_output_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "up"
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    listening.set_inheritable(True)  # as the gateway's own listening socket is
    # By what the descriptor is, not its number: dash keeps a descriptor of its own at 10.
    socket_link = f"socket:[{os.fstat(listening.fileno()).st_ino}]"
    script = (
        f"echo hook says hello; for fd in /proc/$$/fd/*; do readlink $fd; done > {tmp_path / 'fds'}; "
        f"touch {marker}; exec sleep 60"
    )
    hook = LoadHook(kind=LoadHookKind.COMMAND, command=["sh", "-c", script], timeout_s=30)
    deployment = DeploymentSettings(name="old", api_base="http://127.0.0.1:9/v1", model="m", load_hook=hook)

    async def healthy() -> bool:
        return marker.exists()

    started: list[subprocess.Popen[bytes]] = []
    caplog.set_level(logging.INFO, logger="gateway.releases.load_hooks")
    try:
        assert asyncio.run(bring_up(deployment, hook, None, healthy, started)) is None
        (process,) = started
        assert os.getsid(process.pid) == process.pid != os.getsid(0), "the hook leads its own session"
        held = (tmp_path / "fds").read_text().split()
        assert "/dev/null" in held, held  # the listing ran
        assert socket_link not in held, "the hook inherited a listening socket"
        logged = re.search(r"its output goes to (\S+)", caplog.text)
        assert logged, caplog.text
        assert Path(logged.group(1)).read_text().startswith("hook says hello")
    finally:
        listening.close()
        for process in started:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


def test_a_lora_hook_loads_the_release_adapter_in_place_under_the_deployment_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM refuses a name it holds unless asked to load in place; the name is what clients address."""
    sent: list[httpx.Request] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, text="Success")

    transport = httpx.MockTransport(vllm)
    monkeypatch.setattr(
        "gateway.releases.load_hooks.httpx.AsyncClient", functools.partial(httpx.AsyncClient, transport=transport)
    )
    hook = LoadHook(kind=LoadHookKind.LORA, lora_name="tiny-ft", timeout_s=5)
    deployment = DeploymentSettings(name="ft", api_base="http://127.0.0.1:9/v1", model="tiny-ft", load_hook=hook)

    async def healthy() -> bool:
        return True

    assert asyncio.run(bring_up(deployment, hook, "/r/tiny-lora/step-1", healthy, [])) is None
    (request,) = sent
    assert request.url.path == "/v1/load_lora_adapter"
    body = json.loads(request.content)
    assert body == {"lora_name": "tiny-ft", "lora_path": "/r/tiny-lora/step-1", "load_inplace": True}
