"""Releases end to end: two replicas on one Redis, promote with a preflight, one-call rollback
reaching both replicas, refusals when the target is broken, the CLI and the page's button."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from click.testing import CliRunner

from gateway.auth import new_secret
from gateway.cli.main import cli
from gateway.cli.processes import Announced
from gateway.releases.checkpoints import CheckpointRegistry
from tests.procs import Gateway, delete_redis_prefix, deployment, gateway_config, redis_store_config, running_gateway

MODEL = "sim-model"
QUESTION = [{"role": "user", "content": "which release answers?"}]
SMOKE = Path(__file__).resolve().parents[2] / "eval" / "examples" / "smoke.yaml"


def checkpoint(root: Path, run: str, step: int, registry: CheckpointRegistry) -> Path:
    path = root / f"{run}-{step}"
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    registry.register(path, run, step)
    return path


def expected_text(sim: Announced, system_prompt: str) -> str:
    """What this sim answers with this release's prompt in front (the sim is deterministic)."""
    messages = [{"role": "system", "content": system_prompt}, *QUESTION]
    body = {"model": MODEL, "messages": messages, "max_tokens": 6}
    return str(
        httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10).json()["choices"][0]["message"]["content"]
    )


def answer(gateway: Gateway) -> str:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 6}
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=10)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def admin(gateway: Gateway, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/admin/models/{MODEL}/{path}",
        json=body or {},
        headers=gateway.headers(gateway.admin_key),
        timeout=60,
    )


def wait_for_answer(gateway: Gateway, wanted: str, within_s: float) -> float:
    """Seconds until `gateway` answers with `wanted` (bounded by within_s)."""
    started = time.monotonic()
    while answer(gateway) != wanted:
        assert time.monotonic() - started < within_s, f"{gateway.url} did not switch within {within_s}s"
        time.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture
def setup(sim_pair: list[Announced], tmp_path: Path) -> Iterator[dict[str, Any]]:
    registry_root = tmp_path / "registry"
    registry = CheckpointRegistry(registry_root)
    old_ckpt = checkpoint(tmp_path / "ckpt", "ft", 100, registry)
    new_ckpt = checkpoint(tmp_path / "ckpt", "ft", 200, registry)
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(
        deployment("old", sim_pair[0]),
        deployment("new", sim_pair[1], priority=1),
        store=redis_store_config(prefix),
        releases={
            "checkpoint_registry": str(registry_root),
            "watch_interval_s": 0.1,
            "file_roots": [str(SMOKE.parent), str(tmp_path)],  # eval sets and smoke samples named over HTTP
        },
    )
    admin_key = new_secret()
    try:
        with ExitStack() as stack:
            one = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            two = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            two.key = one.key
            specs = {
                "v1": {"version": "v1", "deployments": ["old"], "checkpoint": "ft@100", "system_prompt": "You are v1."},
                "v2": {"version": "v2", "deployments": ["new"], "checkpoint": "ft@200", "system_prompt": "You are v2.",
                       "eval_set": str(SMOKE)},
            }  # fmt: skip
            for spec in specs.values():
                assert (
                    httpx.post(
                        f"{one.url}/admin/models/{MODEL}/releases",
                        json=spec,
                        headers=one.headers(one.admin_key),
                        timeout=10,
                    ).status_code
                    == 201
                )
            yield {
                "replicas": (one, two),
                "texts": {
                    "v1": expected_text(sim_pair[0], "You are v1."),
                    "v2": expected_text(sim_pair[1], "You are v2."),
                },
                "checkpoints": {"v1": old_ckpt, "v2": new_ckpt},
                "config": one.config_path,
            }
    finally:
        delete_redis_prefix(prefix)


def test_promote_then_one_call_rollback_reaches_every_replica(setup: dict[str, Any]) -> None:
    one, two = setup["replicas"]
    texts = setup["texts"]
    assert admin(one, "promote", {"version": "v1"}).json()["active"] == "v1"
    wait_for_answer(two, texts["v1"], within_s=1.0)
    promoted = admin(one, "promote", {"version": "v2", "reason": "new checkpoint"})
    assert promoted.status_code == 200, promoted.text
    assert wait_for_answer(two, texts["v2"], within_s=1.0) < 1.0
    assert answer(one) == texts["v2"]

    rolled = admin(two, "rollback", {"reason": "TPOT regression"})
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["active"] == "v1"
    assert wait_for_answer(one, texts["v1"], within_s=1.0) < 1.0
    again = admin(one, "rollback", {"version": "v1"})
    assert again.json()["changed"] is False, "rolling back to the active release changes nothing"

    audit = httpx.get(
        f"{one.url}/admin/audit",
        params={"kind": "admin", "limit": 1000},
        headers=one.headers(one.admin_key),
        timeout=10,
    )
    actions = [(r["action"], r["reason"]) for r in audit.json()["data"] if r["action"].startswith("release.")]
    assert ("release.rollback", "TPOT regression") in actions
    requests = httpx.get(
        f"{one.url}/admin/audit",
        params={"kind": "request", "limit": 1000},
        headers=one.headers(one.admin_key),
        timeout=10,
    )
    assert {r["release"] for r in requests.json()["data"]} >= {"v1", "v2"}


def test_broken_checkpoint_fails_the_preflight_and_nothing_switches(setup: dict[str, Any]) -> None:
    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    weights = setup["checkpoints"]["v2"] / "model.safetensors"
    good = weights.read_bytes()
    flipped = bytearray(good)
    flipped[1000] ^= 0x01  # one flipped bit
    weights.write_bytes(bytes(flipped))
    refused = admin(one, "promote", {"version": "v2"})
    assert refused.status_code == 409
    assert "changed: model.safetensors" in refused.json()["error"]["message"]
    assert answer(one) == setup["texts"]["v1"]

    weights.write_bytes(good)
    admin(one, "promote", {"version": "v2"}).raise_for_status()
    shutil.rmtree(setup["checkpoints"]["v1"])  # the old weights are gone: rolling back to them must fail
    refused = admin(one, "rollback", {"reason": "try"})
    assert refused.status_code == 409, refused.text
    assert "ft@100" in refused.json()["error"]["message"]
    overview = httpx.get(f"{one.url}/admin/models/{MODEL}/releases", headers=one.headers(one.admin_key), timeout=10)
    assert overview.json()["active"] == "v2"


def test_concurrent_rollbacks_are_serialized(setup: dict[str, Any]) -> None:
    one, two = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    admin(one, "promote", {"version": "v2"}).raise_for_status()

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            calls = [
                client.post(
                    f"{g.url}/admin/models/{MODEL}/rollback", json={"version": "v1"}, headers=g.headers(g.admin_key)
                )
                for g in (one, two)
            ]
            return list(await asyncio.gather(*calls))

    results = asyncio.run(both())
    assert [r.status_code for r in results] == [200, 200]
    assert sorted(r.json()["changed"] for r in results) == [False, True]


def test_cli_rollback_switches_the_running_replicas(setup: dict[str, Any]) -> None:
    one, two = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    admin(one, "promote", {"version": "v2"}).raise_for_status()
    result = CliRunner().invoke(
        cli, ["releases", "rollback", MODEL, "--config", str(setup["config"]), "--reason", "cli"]
    )
    assert result.exit_code == 0, result.output
    assert '"active": "v1"' in result.output
    assert wait_for_answer(two, setup["texts"]["v1"], within_s=1.0) < 1.0


def test_roll_back_button_on_the_releases_page(setup: dict[str, Any], tmp_path: Path) -> None:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until
    from selenium.webdriver.support.ui import WebDriverWait

    one, two = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    admin(one, "promote", {"version": "v2"}).raise_for_status()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
    flags += ["--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'ui'}"]
    for flag in flags:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        driver.get(f"{one.url}/admin/ui/releases?model={MODEL}")
        driver.find_element(By.ID, "key").send_keys(one.admin_key)
        driver.find_element(By.ID, "load").click()
        WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "status"), "active: v2"))
        driver.find_element(By.ID, "rollback").click()
        WebDriverWait(driver, 15).until(
            until.text_to_be_present_in_element((By.ID, "status"), "rolled back: active v1")
        )
    finally:
        driver.quit()
    assert wait_for_answer(two, setup["texts"]["v1"], within_s=1.0) < 1.0


def test_rollback_runs_the_load_hook_of_a_stopped_deployment(sim_pair: list[Announced], tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import sys

    from tests.procs import start_sim

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pidfile = tmp_path / "hook.pid"
    start = (
        f"echo $$ > {pidfile}; exec {sys.executable} -m gateway.sim --port {port} --ttft-ms 5 --tpot-ms 1 --jitter 0"
    )
    old = start_sim(port=port)
    old_deployment = {
        **deployment("old", old),
        "load_hook": {"kind": "command", "command": ["sh", "-c", start], "timeout_s": 30},
    }
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(
        old_deployment, deployment("new", sim_pair[1], priority=1), store=redis_store_config(prefix)
    )
    try:
        with running_gateway(tmp_path, config) as gateway:
            for version, name in (("v1", "old"), ("v2", "new")):
                body = {"version": version, "deployments": [name]}
                url = f"{gateway.url}/admin/models/{MODEL}/releases"
                assert (
                    httpx.post(url, json=body, headers=gateway.headers(gateway.admin_key), timeout=10).status_code
                    == 201
                )
                admin(gateway, "promote", {"version": version}).raise_for_status()
            old.stop()  # the old deployment is gone; a rollback must bring it back first
            rolled = admin(gateway, "rollback", {"reason": "bring v1 back"})
            assert rolled.status_code == 200, rolled.text
            assert rolled.json()["active"] == "v1"
            body = {"model": MODEL, "messages": QUESTION, "max_tokens": 3}
            assert (
                httpx.post(
                    f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=10
                ).status_code
                == 200
            )
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        old.stop()
        delete_redis_prefix(prefix)


def test_promotion_runs_a_replay_smoke_run_against_the_release(setup: dict[str, Any], tmp_path: Path) -> None:
    one, _ = setup["replicas"]
    samples = tmp_path / "smoke.jsonl"
    lines = [orjson.dumps({"messages": [{"role": "user", "content": f"smoke {i}"}]}) for i in range(4)]
    samples.write_bytes(b"\n".join(lines))
    base = f"{one.url}/admin/models/{MODEL}"
    headers = one.headers(one.admin_key)
    meets = {"version": "v3", "deployments": ["new"], "smoke_samples": str(samples), "smoke_count": 4,
             "smoke_slo_ttft_ms": 2000}  # fmt: skip
    misses = {**meets, "version": "v4", "smoke_slo_ttft_ms": 0.001}
    for body in (meets, misses):
        assert httpx.post(f"{base}/releases", json=body, headers=headers, timeout=10).status_code == 201
    assert admin(one, "promote", {"version": "v3"}).status_code == 200
    refused = admin(one, "promote", {"version": "v4"})
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert "replay smoke run: goodput 0.00 below the required 1: 4 of 4 requests missed ttft<=0.001ms" in message


def test_a_failing_canary_is_rolled_back_automatically(sims: list[Announced], tmp_path: Path) -> None:
    from tests.procs import set_faults

    config = gateway_config(deployment("old", sims[0]), deployment("new", sims[1], priority=1))
    with running_gateway(tmp_path, config) as gateway:
        base = f"{gateway.url}/admin/models/{MODEL}"
        headers = gateway.headers(gateway.admin_key)
        for version, name in (("v1", "old"), ("v2", "new")):
            body = {"version": version, "deployments": [name]}
            assert httpx.post(f"{base}/releases", json=body, headers=headers, timeout=10).status_code == 201
        admin(gateway, "promote", {"version": "v1"}).raise_for_status()
        canary = {"version": "v2", "share": 0.5, "window_s": 60, "max_error_rate": 0.2, "min_requests": 5}
        started = httpx.post(f"{base}/canary", json=canary, headers=headers, timeout=30)
        assert started.status_code == 200, started.text
        set_faults(sims[1], status=500)  # the candidate breaks after passing its preflight

        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 3}
        statuses = []
        for _ in range(120):  # bounded: the breach needs 5 failed candidate requests
            reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=10)
            statuses.append(reply.status_code)
            overview = httpx.get(f"{base}/releases", headers=headers, timeout=10).json()
            if overview["canary"] is None:
                break
        assert overview["canary"] is None, "the canary was never rolled back"
        assert overview["active"] == "v1"
        assert sum(status != 200 for status in statuses) >= 5  # 502, then 503 once its breaker opened
        after = [
            httpx.post(
                f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=10
            ).status_code
            for _ in range(10)
        ]
        assert after == [200] * 10, "no traffic reaches the candidate any more"
        audit = httpx.get(
            f"{gateway.url}/admin/audit", params={"kind": "admin", "limit": 1000}, headers=headers, timeout=10
        )
        rollbacks = [r for r in audit.json()["data"] if r["action"] == "release.canary.rollback"]
        assert rollbacks
        assert "error rate" in rollbacks[0]["reason"]
