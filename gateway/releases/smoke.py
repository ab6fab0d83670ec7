"""The replay smoke run of a release preflight, in its own process, judged on what it measured.

A child process keeps the replay's event loop and garbage-collector settings out of the server.
The verdict is read from the replay's result file, not from its exit code: the exit code also
speaks about the measuring process (whether the replay tool's own delay distorted its timings),
and a release must not be refused because the machine running the preflight was busy. What is
judged is what was measured about the release:

- every request succeeded (the failure reasons and an example are named otherwise);
- goodput under the release's SLOs is at least its minimum. A request that missed an SLO by no
  more than the replay tool's own delay on it is not judged either way (replay reports those as
  unjudged); a miss beyond that is the release's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from gateway.store.release_record import SmokePin

_TIMEOUT_S = 300.0
_OUTPUT_LINES = 3
_ENDPOINT_VARIABLES = frozenset({"REPLAY_BASE_URL", "OPENAI_BASE_URL", "REPLAY_API_KEY", "OPENAI_API_KEY"})


async def run_smoke(smoke: SmokePin, base_url: str, api_key: str, model: str, system_prompt: str = "") -> str | None:
    """None when the smoke run met its bar, else the reason, in words an operator can act on.

    `system_prompt` goes in front of every sample, for a run that does not go through the gateway
    (which would put the release's prompt there itself)."""
    with tempfile.TemporaryDirectory(prefix="agw-smoke-") as scratch:
        out = Path(scratch) / "result.json"
        samples = Path(smoke.samples)
        if system_prompt:
            samples = _with_system_prompt(samples, system_prompt, Path(scratch) / "samples.jsonl")
        command, env = smoke_command(smoke, samples, base_url, api_key, model, out)
        output_path = Path(scratch) / "output.log"
        process = await asyncio.to_thread(_start, command, env, output_path)
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                await asyncio.to_thread(process.wait)  # the kill below ends this thread's wait too
        except BaseException as stopped:  # timed out, or the preflight was cancelled: no orphan
            if process.poll() is None:
                process.kill()
                await asyncio.to_thread(process.wait)
            if isinstance(stopped, TimeoutError):
                return f"did not finish within {_TIMEOUT_S:g}s"
            raise
        if not out.is_file():
            output = output_path.read_bytes()
            tail = " / ".join(output.decode(errors="replace").strip().splitlines()[-_OUTPUT_LINES:])
            return f"the replay did not run (exit {process.returncode}): {tail}"
        return smoke_verdict(orjson.loads(out.read_bytes()), smoke.min_goodput)


def _start(command: list[str], env: dict[str, str], output: Path) -> subprocess.Popen[bytes]:
    # Not the event loop's subprocess support: under uvloop that keeps inheritable descriptors open,
    # and the gateway's listening socket is one (a child outliving a crashed gateway held its port).
    # Its own session: a signal to the gateway's process group is the gateway's.
    with output.open("wb") as sink:
        return subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
        )


def smoke_command(
    smoke: SmokePin, samples: Path, base_url: str, api_key: str, model: str, out: Path
) -> tuple[list[str], dict[str, str]]:
    """The replay's command line and environment. The key and the address travel in the
    environment: a command line is readable by every user of the machine (ps, /proc)."""
    command = [sys.executable, "-m", "gateway", "replay", "run", str(samples), "--model", model,
               "--count", str(smoke.count), "--concurrency", "2", "--max-tokens", "16",
               "--min-success-rate", "0", "--allow-lag", "--quiet", "--out", str(out)]  # fmt: skip
    for metric, limit_ms in (("ttft", smoke.slo_ttft_ms), ("tpot", smoke.slo_tpot_ms)):
        if limit_ms:
            command += ["--slo", f"{metric}={limit_ms:g}ms"]
    # Whatever the gateway's own environment says about some other endpoint must not leak in.
    env = {name: value for name, value in os.environ.items() if name not in _ENDPOINT_VARIABLES}
    env["REPLAY_BASE_URL"] = base_url
    if api_key:
        env["REPLAY_API_KEY"] = api_key
    return command, env


def _with_system_prompt(samples: Path, prompt: str, copy: Path) -> Path:
    """A copy of `samples` with `prompt` as the first message of each, in the shared format (it
    keeps a sample's category and timestamp apart from its request); the original when it cannot
    be read, so that the replay reports why."""
    from replay.samples import SampleError, load_samples

    try:
        loaded = load_samples(samples)
    except SampleError:
        return samples
    system = {"role": "system", "content": prompt}
    lines = []
    for sample in loaded.samples:
        line: dict[str, Any] = {
            "id": sample.id,
            "body": {**sample.body, "messages": [system, *sample.body.get("messages", [])]},
        }
        for meta in ("category", "timestamp", "expect_finish_reason", "expect_tool_call"):
            if getattr(sample, meta) is not None:
                line[meta] = getattr(sample, meta)
        lines.append(orjson.dumps(line))
    copy.write_bytes(b"\n".join(lines) + b"\n")
    return copy


def smoke_verdict(result: Mapping[str, Any], min_goodput: float) -> str | None:
    """None when every request succeeded and goodput is at least `min_goodput`; else why not."""
    summary = result["summary"]
    problems = []
    if summary["requests"] == 0:
        return "no request was sent" + (f": {result['aborted']}" if result.get("aborted") else "")
    if summary["failed"]:
        reasons = ", ".join(
            f"{row['reason']} x{row['count']} (e.g. {row['example']['detail'][:160]})"
            for row in summary["failures"]
            if row["is_failure"]
        )
        problems.append(f"{summary['failed']} of {summary['requests']} requests failed: {reasons}")
    goodput = summary.get("goodput")
    if summary.get("slos") and summary["succeeded"]:
        problems += _goodput_problem(summary, goodput, min_goodput)
    return "; ".join(problems) or None


def _goodput_problem(summary: Mapping[str, Any], goodput: float | None, min_goodput: float) -> list[str]:
    slos = ", ".join(f"{metric}<={limit * 1000:g}ms" for metric, limit in summary["slos"].items())
    unjudged = summary.get("unjudged_slos") or 0
    if goodput is None:
        return [
            f"no request could be judged against {slos}: each missed it by no more than the replay "
            f"tool's own delay on it ({unjudged} requests); rerun the preflight"
        ]
    if goodput >= min_goodput:
        return []
    latency = summary["latency"]
    seen = ", ".join(
        f"{metric} p50 {latency[metric]['p50'] * 1000:.1f} ms" for metric in summary["slos"] if latency[metric]["p50"]
    )
    missed = summary["requests"] - (summary.get("met_slos") or 0) - unjudged
    return [
        f"goodput {goodput:.2f} below the required {min_goodput:g}: {missed} of {summary['requests'] - unjudged} "
        f"requests missed {slos}" + (f" (measured {seen})" if seen else "")
    ]
