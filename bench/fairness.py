"""Fairness under overload: clients that retry 10 ms after a 429 against clients that honour
Retry-After, with the gateway's early-retry refusal on and off.

    python -m bench.fairness [--seconds 20] [--clients 8]

One fast sim (ttft 200 ms) behind a deployment with `max_inflight: 2`, so the gateway is
overloaded and answers 429 `Retry-After: 1` once both slots are taken. Half the clients (each
with its own key) retry 10 ms after a 429, half wait the Retry-After they were sent. It prints
the answers each group got and their ratio (target with the refusal on: close to 1; measured
16.5 off, 1.00 on, 30 s runs).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from testkit.procs import deployment, gateway_config, gateway_process, start_sim

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "fair?"}], "max_tokens": 4}


async def client(url: str, key: str, eager: bool, until: float, counts: dict[str, int]) -> None:
    group = "eager" if eager else "patient"
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        while time.monotonic() < until:
            reply = await http.post(f"{url}/v1/chat/completions", json=BODY)
            if reply.status_code == 200:
                counts[group] += 1
            elif reply.status_code == 429:
                await asyncio.sleep(0.01 if eager else float(reply.headers.get("Retry-After", "1")))
            else:
                counts["other"] += 1


def measure(refuse_early: bool, seconds: float, clients: int) -> dict[str, int]:
    sim = start_sim("--ttft-ms", "200", "--tpot-ms", "1")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = gateway_config(deployment("a", sim, max_inflight=2), quota={"refuse_early_retries": refuse_early})
            with gateway_process(Path(tmp), config) as gateway:
                keys = [gateway.create_key()[1] for _ in range(clients)]
                counts = {"eager": 0, "patient": 0, "other": 0}
                until = time.monotonic() + seconds

                async def run() -> None:
                    await asyncio.gather(
                        *(client(gateway.url, key, i % 2 == 0, until, counts) for i, key in enumerate(keys))
                    )

                asyncio.run(run())
                return counts
    finally:
        sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    print("| early-retry refusal | eager answers | patient answers | eager / patient |")
    print("|---|---|---|---|")
    for refuse in (False, True):
        counts = measure(refuse, args.seconds, args.clients)
        ratio = counts["eager"] / max(1, counts["patient"])
        print(f"| {'on' if refuse else 'off'} | {counts['eager']} | {counts['patient']} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
