"""How long `gateway demo` takes from the command to the first streamed token of its own snippet:
`python -m bench.demo_first_answer [--runs N]`. Each run starts a fresh demo on free ports, waits
for the snippet, sends the snippet's request, and stops the demo (SIGTERM) before the next run.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

GATEWAY = str(Path(sys.executable).with_name("gateway"))


def one_run() -> tuple[float, float]:
    """(seconds until the snippet is printed, seconds until the first token arrived)."""
    started = time.perf_counter()
    command = [GATEWAY, "demo", "--port", "0", "--sim-ports", "0,0"]
    demo = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert demo.stdout is not None
        text = ""
        for _ in range(80):
            line = demo.stdout.readline()
            if not line:
                raise RuntimeError(f"the demo exited:\n{text}")
            text += line
            if "Stop: Ctrl-C" in line:
                break
        ready = time.perf_counter() - started
        url = re.search(r'base_url="([^"]+)"', text)
        key = re.search(r'api_key="([^"]+)"', text)
        if url is None or key is None:
            raise RuntimeError(f"no URL or key in the snippet:\n{text}")
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "Hello!"}], "stream": True}
        headers = {"authorization": f"Bearer {key.group(1)}"}
        with httpx.stream("POST", f"{url.group(1)}/chat/completions", json=body, headers=headers, timeout=30) as reply:
            for line in reply.iter_lines():
                if '"content"' in line:
                    return ready, time.perf_counter() - started
        raise RuntimeError("no token in the answer")
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    runs = [one_run() for _ in range(parser.parse_args().runs)]
    ready, first = [r for r, _ in runs], [f for _, f in runs]
    print("| runs | snippet printed: median s (max) | first token: median s (max) |\n|---|---|---|")
    cells = [f"{statistics.median(series):.2f} ({max(series):.2f})" for series in (ready, first)]
    print(f"| {len(runs)} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
