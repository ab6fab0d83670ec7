"""A streamed Messages API answer is a session's stream like a chat one (issue 32): a client that
reconnects with `Last-Event-ID` gets exactly the events it missed, and the two parts make one
whole message (one message_start, blocks numbered once, message_stop at the end). A replica
SIGKILLed mid-message is taken over by another (tests/surfaces/test_responses_sessions.py runs
that on its Redis pair)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway
from tests.e2e.test_sessions import parse, resume

BODY = {"model": "sim-model", "max_tokens": 30, "messages": [{"role": "user", "content": "a resumable answer"}]}


@pytest.fixture(scope="module")
def gateway(slow_sim: Announced, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("messages-sessions")
    with running_gateway(path, gateway_config(deployment("a", slow_sim))) as running:
        yield running


def whole_text(gateway: Gateway) -> str:
    reply = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers={"x-api-key": gateway.key}, timeout=20)
    return "".join(block["text"] for block in reply.json()["content"])


def read_then_drop(gateway: Gateway, session_id: str, keep: int, kill_pid: int | None = None) -> list[tuple[int, Any]]:
    """The first `keep` events of a new streamed message, read before dropping the connection (or
    SIGKILLing the replica)."""
    lines: list[str] = []
    headers = {"x-api-key": gateway.key, "X-Session-Id": session_id}
    body = {**BODY, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, headers=headers, timeout=20) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            lines.append(line)
            if len(parse(lines)) == keep:
                if kill_pid is not None:
                    os.kill(kill_pid, signal.SIGKILL)
                break
    return parse(lines)


def assert_one_whole_message(events: list[tuple[int, Any]], text: str) -> None:
    assert [seq for seq, _ in events] == list(range(1, len(events) + 1))
    kinds = [payload["type"] for _, payload in events]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("message_start") == 1
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert "".join(p["delta"]["text"] for _, p in events if p["type"] == "content_block_delta") == text


@pytest.mark.parametrize("keep", [1, 4, 15])
def test_a_messages_stream_resumed_after_a_disconnect_loses_and_repeats_nothing(gateway: Gateway, keep: int) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    seen = read_then_drop(gateway, session_id, keep)
    assert_one_whole_message(seen + resume(gateway, session_id, seen[-1][0]), whole_text(gateway))
