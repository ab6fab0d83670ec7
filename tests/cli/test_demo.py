"""`gateway demo` works as the README says: the printed snippet's key and URL serve a stream."""

from __future__ import annotations

import re
from typing import IO

from openai import OpenAI

from gateway.cli.processes import start_announcing


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
