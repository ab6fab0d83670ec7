"""A command load hook runs detached from the gateway: its own session, no inherited
descriptors, and its output in a file the gateway's log names."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

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
    fd = listening.fileno()
    script = f"echo hook says hello; ls /proc/$$/fd > {tmp_path / 'fds'}; touch {marker}; exec sleep 60"
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
        assert str(fd) not in (tmp_path / "fds").read_text().split(), "the hook inherited a listening socket"
        logged = re.search(r"its output goes to (\S+)", caplog.text)
        assert logged, caplog.text
        assert Path(logged.group(1)).read_text().startswith("hook says hello")
    finally:
        listening.close()
        for process in started:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
