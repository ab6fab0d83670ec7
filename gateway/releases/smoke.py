"""The replay smoke run of a release preflight, in its own process.

`gateway replay` measures its own event-loop lag and refuses figures a busy loop would distort; run
inside the gateway, the gateway's own traffic would be that busy loop. A child process also keeps
the replay's garbage-collector settings out of the server.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

_TIMEOUT_S = 300.0


async def run_smoke(smoke: dict[str, Any], base_url: str, api_key: str, model: str) -> str | None:
    """None when the smoke run met its SLOs, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="agw-smoke-") as scratch:
        out = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "gateway", "replay", "run", smoke["samples"], "--base-url", base_url,
                   "--model", model, "--count", str(smoke["count"]), "--concurrency", "2", "--max-tokens", "16",
                   "--min-goodput", str(smoke["min_goodput"]), "--quiet", "--out", str(out)]  # fmt: skip
        for metric in ("ttft", "tpot"):
            if smoke.get(f"slo_{metric}_ms"):
                command += ["--slo", f"{metric}={smoke[f'slo_{metric}_ms']:g}ms"]
        if api_key:
            command += ["--api-key", api_key]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                output, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            return f"did not finish within {_TIMEOUT_S:g}s"
        if process.returncode == 0:
            return None
        return _summary(out) or output.decode(errors="replace").strip().splitlines()[-1]


def _summary(out: Path) -> str:
    if not out.is_file():
        return ""
    result = orjson.loads(out.read_bytes())
    summary = result.get("summary", {})
    return (
        f"success rate {summary.get('success_rate')}, goodput {summary.get('goodput')} (gates: {result.get('gates')})"
    )
