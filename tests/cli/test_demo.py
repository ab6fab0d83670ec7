"""`gateway demo` works as the README says: the printed snippet's key and URL serve a stream, and
no process or temporary folder outlives it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from openai import OpenAI

from common.processes import start_announcing
from testkit.procs import child_pids, wait_gone


def read_until(stream: IO[str], marker: str, max_lines: int = 60) -> str:
    """The demo prints its snippet in one write right after the ready line, so plain readline
    (not select: the text wrapper may already hold those lines in its buffer) is bounded."""
    seen = ""
    for _ in range(max_lines):
        line = stream.readline()
        assert line, f"the demo exited:\n{seen}"
        seen += line
        if marker in line:
            return seen
    raise AssertionError(f"no {marker!r} in the demo output:\n{seen}")


def test_demo_prints_a_snippet_that_works() -> None:
    demo = start_announcing(["gateway", "demo", "--port", "0", "--sim-ports", "0,0"])
    try:
        assert demo.process.stdout is not None
        text = read_until(demo.process.stdout, "Stop: Ctrl-C")
        key = re.search(r'api_key="(agw_[A-Za-z0-9_-]+)"', text)
        assert key is not None, text
        client = OpenAI(base_url=f"{demo.url}/v1", api_key=key.group(1), max_retries=0, timeout=10)
        stream = client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "Hello!"}], stream=True
        )
        reply = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert reply.strip()
    finally:
        demo.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_no_process_or_folder_outlives_the_demo(signum: signal.Signals, tmp_path: Path) -> None:
    """SIGINT goes to the demo's whole process group, as a terminal's Ctrl-C does."""
    with tempfile.TemporaryFile("w+") as stderr:
        demo = start_announcing(
            ["gateway", "demo", "--port", "0", "--sim-ports", "0,0"], env={"TMPDIR": str(tmp_path)}, stderr=stderr
        )
        try:
            assert demo.process.stdout is not None
            read_until(demo.process.stdout, "Stop: Ctrl-C")
            sims = child_pids(demo.process.pid)
            assert len(sims) == 2
            assert len(list(tmp_path.glob("agw-demo-*"))) == 1
            if signum == signal.SIGINT:
                os.killpg(os.getpgid(demo.process.pid), signum)
            else:
                demo.process.send_signal(signum)
            assert demo.process.wait(30) in (0, 130)
        finally:
            demo.stop()
        assert wait_gone(sims) == set()
        stderr.seek(0)
        assert "Aborted!" not in stderr.read()
    assert list(tmp_path.glob("agw-demo-*")) == []


def test_keep_data_keeps_the_demo_folder(tmp_path: Path) -> None:
    demo = start_announcing(
        ["gateway", "demo", "--port", "0", "--sim-ports", "0,0", "--keep-data"], env={"TMPDIR": str(tmp_path)}
    )
    try:
        assert demo.process.stdout is not None
        read_until(demo.process.stdout, "Stop: Ctrl-C")
        demo.process.send_signal(signal.SIGTERM)
        assert demo.process.wait(30) == 0
    finally:
        demo.stop()
    assert len(list(tmp_path.glob("agw-demo-*/*"))) > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_sims_stop_when_the_demo_is_killed_outright(tmp_path: Path) -> None:
    # A demo killed outright cannot remove its data folder: keep it in the test's own directory.
    demo = start_announcing(["gateway", "demo", "--port", "0", "--sim-ports", "0,0"], env={"TMPDIR": str(tmp_path)})
    try:
        assert demo.process.stdout is not None
        read_until(demo.process.stdout, "Stop: Ctrl-C")
        sims = child_pids(demo.process.pid)
        assert len(sims) == 2
        demo.process.kill()
        demo.process.wait(30)
    finally:
        demo.stop()
    assert wait_gone(sims) == set()


def test_the_demo_offers_a_tool_call_a_person_can_approve() -> None:
    """The printed tool-call example uses a natural schema (no enum trick): the sim fills it so
    that the demo policy holds it for approval, and once approved the call comes back."""
    demo = start_announcing(["gateway", "demo", "--port", "0", "--sim-ports", "0,0"])
    try:
        assert demo.process.stdout is not None
        text = read_until(demo.process.stdout, "Stop: Ctrl-C")
        key = re.search(r"Bearer (agw_[A-Za-z0-9_-]+)", text)
        approver = re.search(r"approver key (agw_[A-Za-z0-9_-]+)", text)
        body = re.search(r"-d '(\{.*refund_payment.*\})'", text)
        assert key, text
        assert approver, text
        assert body, text
        tool = json.loads(body.group(1))["tools"][0]["function"]
        assert "enum" not in json.dumps(tool)
        decided: list[dict[str, Any]] = []
        person = threading.Thread(target=approve_first_pending, args=(demo.url, approver.group(1), decided))
        person.start()
        curl = re.search(r"^    (curl .*?\}')$", text, re.M | re.S)
        assert curl, text
        done = subprocess.run(  # the command as printed, through a shell, as a person pastes it
            ["bash", "-c", curl.group(1).replace("curl ", "curl -sf --max-time 60 ", 1)],
            capture_output=True,
            text=True,
            timeout=90,
        )
        person.join(60)
    finally:
        demo.stop()
    assert done.returncode == 0, done.stderr
    [call] = json.loads(done.stdout)["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "refund_payment"
    assert decided
    assert call["approval_id"] == decided[0]["id"]
    assert re.fullmatch(r"ord_[0-9]+", json.loads(call["function"]["arguments"])["order_id"])


def approve_first_pending(url: str, approver: str, decided: list[dict[str, Any]]) -> None:
    """The person at the approvals page: approve the first pending call (bounded wait)."""
    with httpx.Client(base_url=f"{url}/admin", headers={"authorization": f"Bearer {approver}"}, timeout=10) as admin:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            pending = admin.get("/approvals", params={"status": "pending"}).json()["data"]
            if pending:
                decided.append(admin.post(f"/approvals/{pending[0]['id']}/approve", json={"reason": "ok"}).json())
                return
            time.sleep(0.05)
