"""How long a release switch made on one replica takes to reach another.

Two gateway replicas on one Redis, two simulated backends (one per release, each release with its
own system prompt, so an answer shows which release served it). The script switches releases on
replica A, alternating promote and rollback, and times until replica B's answers change.

    python -m bench.switch_propagation [--switches 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from gateway.auth.stage import new_secret
from testkit.procs import delete_redis_prefix, deployment, gateway_config, gateway_process, start_sim

MODEL = "sim-model"
QUESTION = [{"role": "user", "content": "which release?"}]


def answer(url: str, key: str) -> str:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return str(reply.json()["choices"][0]["message"]["content"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--watch-interval", type=float, default=0.25, help="releases.watch_interval_s")
    args = parser.parse_args()
    sims = [start_sim(), start_sim()]
    prefix = f"bench-switch-{uuid.uuid4().hex[:8]}"
    redis_url = "redis://127.0.0.1:6379/0"
    tmp = Path(tempfile.mkdtemp(prefix="agw-switch-"))
    config = gateway_config(
        deployment("old", sims[0]),
        deployment("new", sims[1], priority=1),
        store={"kind": "redis", "url": redis_url, "key_prefix": prefix},
        releases={"watch_interval_s": args.watch_interval},
    )
    admin_key = new_secret()
    try:
        with (
            gateway_process(tmp, config, admin_key=admin_key) as a,
            gateway_process(tmp, config, admin_key=admin_key) as b,
        ):
            run(a, b, args.switches, args.watch_interval)
    finally:
        for sim in sims:
            sim.stop()
        delete_redis_prefix(prefix, redis_url)


def run(a: Any, b: Any, switches: int, watch_interval_s: float) -> None:
    admin = {"Authorization": f"Bearer {a.admin_key}"}
    base = f"{a.url}/admin/models/{MODEL}"
    for version, name in (("v1", "old"), ("v2", "new")):
        body = {"version": version, "deployments": [name], "system_prompt": version}
        httpx.post(f"{base}/releases", json=body, headers=admin, timeout=10).raise_for_status()
    texts = {}
    for version in ("v1", "v2"):
        httpx.post(f"{base}/promote", json={"version": version}, headers=admin, timeout=30).raise_for_status()
        time.sleep(1.0)
        texts[version] = answer(a.url, a.key)
    times = []
    for i in range(switches):
        target = "v1" if i % 2 == 0 else "v2"
        switched = time.monotonic()
        httpx.post(f"{base}/promote", json={"version": target}, headers=admin, timeout=30).raise_for_status()
        while answer(b.url, a.key) != texts[target]:
            if time.monotonic() - switched > 5:
                raise SystemExit(f"replica B never switched to {target}")
        times.append((time.monotonic() - switched) * 1000)
    ordered = sorted(times)
    print(f"switches {len(times)}: p50 {statistics.median(ordered):.1f} ms, max {ordered[-1]:.1f} ms")
    print("measured from the promote call on replica A (preflight included) to replica B's first answer")
    print(f"from the new release; releases.watch_interval_s {watch_interval_s:g}")


if __name__ == "__main__":
    main()
