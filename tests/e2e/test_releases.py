"""Releases end to end: two replicas on one Redis, promote with a preflight, one-call rollback
reaching both replicas, refusals when the target is broken, the CLI and the page's button."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from click.testing import CliRunner

from checkpoints.registry import CheckpointRegistry
from common.processes import Announced
from gateway.auth.stage import new_secret
from gateway.cli.main import cli
from testkit.procs import (
    WEATHER_POLICY,
    Gateway,
    audit_records,
    delete_redis_prefix,
    deployment,
    gateway_config,
    gateway_process,
    policy_file,
    redis_store_config,
    running_gateway,
)

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
        # The eval gate runs as the promoting key: the bootstrap admin (tenant "*") gets the users' policy.
        tools={"policy_file": policy_file(tmp_path, WEATHER_POLICY.replace("acme: agent", "acme: agent, '*': agent"))},
    )
    admin_key = new_secret()
    try:
        with ExitStack() as stack:
            one = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            two = stack.enter_context(running_gateway(tmp_path, config, admin_key=admin_key))
            two.key = one.key
            specs = {
                "v1": {"version": "v1", "deployments": ["old"], "checkpoint": "ft@100", "system_prompt": "You are v1."},
                "v2": {
                    "version": "v2",
                    "deployments": ["new"],
                    "checkpoint": "ft@200",
                    "system_prompt": "You are v2.",
                    "eval_set": str(SMOKE),
                },
            }
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


@contextmanager
def chromium(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium driven by selenium (Debian's chromium and chromium-driver)."""
    binary, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and chromedriver):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
    flags += ["--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'ui'}"]
    for flag in flags:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_window_size(1400, 900)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> None:
    """Kept as a test artifact (CI uploads test-artifacts/)."""
    artifacts = Path(__file__).resolve().parents[2] / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    driver.save_screenshot(str(artifacts / name))


def test_roll_back_button_on_the_releases_page(setup: dict[str, Any], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until
    from selenium.webdriver.support.ui import WebDriverWait

    one, two = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    admin(one, "promote", {"version": "v2"}).raise_for_status()
    with chromium(tmp_path) as driver:
        driver.get(f"{one.url}/admin/ui/releases?model={MODEL}")
        driver.find_element(By.ID, "key").send_keys(one.admin_key)
        driver.find_element(By.ID, "load").click()
        WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "status"), "active: v2"))
        button = driver.find_element(By.ID, "rollback")
        WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "rollback"), "Roll back to v1"))
        button.click()
        confirm = driver.find_element(By.ID, "confirm-rollback")
        assert "v2" in driver.find_element(By.ID, "confirm-box").text  # what is rolled back, to what
        confirm.click()  # without a reason: refused on the page, nothing sent
        assert "reason" in driver.find_element(By.ID, "status").text
        assert overview(one)["active"] == "v2"
        driver.find_element(By.ID, "reason").send_keys("TPOT regression")
        driver.execute_script(
            "document.getElementById('confirm-rollback').click();document.getElementById('confirm-rollback').click();"
        )  # a double click
        WebDriverWait(driver, 15).until(
            until.text_to_be_present_in_element((By.ID, "status"), "rolled back: active v1")
        )
        screenshot(driver, "releases-page.png")
    assert wait_for_answer(two, setup["texts"]["v1"], within_s=1.0) < 1.0
    rollbacks = [h for h in overview(one)["history"] if h["action"] == "release.rollback"]
    assert [(h["from"], h["to"], h["reason"]) for h in rollbacks] == [("v2", "v1", "TPOT regression")]


def canary_status(gateway: Gateway) -> dict[str, Any]:
    url = f"{gateway.url}/admin/models/{MODEL}/canary"
    return dict(httpx.get(url, headers=gateway.headers(gateway.admin_key), timeout=10).json())


def test_the_canary_section_of_the_releases_page_shows_live_figures_and_stops_after_confirmation(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until
    from selenium.webdriver.support.ui import WebDriverWait

    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    create(one, version="v3", deployments=["new"], system_prompt="You are v3.")
    canary = {"version": "v3", "share": 0.5, "window_s": 60, "max_latency_ratio": 100}  # equal sims: noise only
    started = httpx.post(
        f"{one.url}/admin/models/{MODEL}/canary", json=canary, headers=one.headers(one.admin_key), timeout=60
    )
    assert started.status_code == 200, started.text
    with chromium(tmp_path) as driver:
        driver.get(f"{one.url}/admin/ui/releases?model={MODEL}")
        driver.find_element(By.ID, "key").send_keys(one.admin_key)
        driver.find_element(By.ID, "load").click()
        WebDriverWait(driver, 15).until(
            until.text_to_be_present_in_element((By.ID, "canary"), "v3 gets 50% of new requests")
        )
        assert "candidate: 0 requests" in driver.find_element(By.ID, "canary").text
        for _ in range(200):  # bounded: each request goes to the candidate with probability 1/2
            answer(one)
            if canary_status(one)["stats"]["candidate"]["requests"] >= 2:
                break
        # The page shows the new figures without another click: it refreshes itself.
        WebDriverWait(driver, 15).until(
            lambda d: re.search(r"candidate: [1-9]\d* requests, errors 0\.0%", d.find_element(By.ID, "canary").text)
        )
        assert re.search(r"active: [0-9]+ requests", driver.find_element(By.ID, "canary").text)
        screenshot(driver, "releases-page-canary.png")
        stop = driver.find_element(By.ID, "stop-canary")
        stop.click()
        WebDriverWait(driver, 5).until(until.alert_is_present())
        assert "Stop the canary?" in driver.switch_to.alert.text
        driver.switch_to.alert.dismiss()  # changed their mind: nothing is sent
        assert canary_status(one)["canary"]["version"] == "v3"
        stop.click()
        WebDriverWait(driver, 5).until(until.alert_is_present())
        driver.switch_to.alert.accept()
        WebDriverWait(driver, 15).until(until.text_to_be_present_in_element((By.ID, "status"), "canary stopped"))
        assert driver.find_element(By.ID, "canary").text == "no canary running"
        assert not driver.find_element(By.ID, "stop-canary").is_displayed()
    assert canary_status(one)["canary"] is None
    assert overview(one)["active"] == "v1", "stopping a canary keeps the active release"
    ended = admin_records(one, "release.canary.rollback")
    assert ended
    assert ended[0]["reason"] == "ended by an operator"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def hooked_releases(gateway: Gateway) -> None:
    """v1 on the hooked deployment "old", v2 on "new", both promoted in that order."""
    for version, name in (("v1", "old"), ("v2", "new")):
        create(gateway, version=version, deployments=[name])
        admin(gateway, "promote", {"version": version}).raise_for_status()


def test_rollback_runs_the_load_hook_of_a_stopped_deployment(sim_pair: list[Announced], tmp_path: Path) -> None:
    from testkit.procs import start_sim

    port = free_port()
    pidfile = tmp_path / "hook.pid"
    start = (
        f"echo $$ > {pidfile}; echo hook says hello; "
        f"exec {sys.executable} -m sim --port {port} --ttft-ms 5 --tpot-ms 1 --jitter 0"
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
            hooked_releases(gateway)
            old.stop()  # the old deployment is gone; a rollback must bring it back first
            rolled = admin(gateway, "rollback", {"reason": "bring v1 back"})
            assert rolled.status_code == 200, rolled.text
            assert rolled.json()["active"] == "v1"
            body = {"model": MODEL, "messages": QUESTION, "max_tokens": 3}
            url = f"{gateway.url}/v1/chat/completions"
            assert httpx.post(url, json=body, headers=gateway.headers(), timeout=10).status_code == 200
            gateway_port = int(gateway.url.rsplit(":", 1)[1])
        # The server the hook started outlives the gateway, but must not hold the gateway's socket.
        assert Path(f"/proc/{int(pidfile.read_text())}").exists()
        assert port_is_free(gateway_port), "the hook's process inherited the gateway's listening socket"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{gateway_port}/healthz", timeout=5)
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        old.stop()
        delete_redis_prefix(prefix)


def test_a_load_hook_that_exits_early_fails_the_rollback_at_once(sim_pair: list[Announced], tmp_path: Path) -> None:
    from testkit.procs import start_sim

    old = start_sim(port=free_port())
    failing = {"kind": "command", "command": ["sh", "-c", "echo no GPU left >&2; exit 3"], "timeout_s": 300}
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(
        {**deployment("old", old), "load_hook": failing},
        deployment("new", sim_pair[1], priority=1),
        store=redis_store_config(prefix),
    )
    try:
        with running_gateway(tmp_path, config) as gateway:
            hooked_releases(gateway)
            old.stop()
            refused = admin(gateway, "rollback", {"reason": "bring v1 back"})  # 60 s client timeout < 300 s
            assert refused.status_code == 409, refused.text
            message = refused.json()["error"]["message"]
            assert "exited with status 3" in message, message
            assert "no GPU left" in message, message
            assert overview(gateway)["active"] == "v2"
    finally:
        old.stop()
        delete_redis_prefix(prefix)


def test_a_cli_rollback_asks_the_gateway_and_runs_no_hook_locally(sim_pair: list[Announced], tmp_path: Path) -> None:
    from testkit.procs import start_sim

    port = free_port()
    pidfile = tmp_path / "hook.pid"
    start = f"echo $$ > {pidfile}; exec {sys.executable} -m sim --port {port} --ttft-ms 5 --tpot-ms 1"
    old = start_sim(port=port)
    hook = {"kind": "command", "command": ["sh", "-c", start], "timeout_s": 30}
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    config = gateway_config(
        {**deployment("old", old), "load_hook": hook},
        deployment("new", sim_pair[1], priority=1),
        store=redis_store_config(prefix),
    )
    try:
        with running_gateway(tmp_path, config) as gateway:
            hooked_releases(gateway)
            old.stop()
            command = ["releases", "rollback", MODEL, "--config", str(gateway.config_path), "--reason", "cli"]
            local = CliRunner().invoke(cli, command)
            assert local.exit_code != 0, local.output
            assert "--gateway" in local.output, local.output
            assert not pidfile.exists(), "the CLI ran the load hook on the operator's machine"
            env = {"GATEWAY_ADMIN_KEY": gateway.admin_key}
            remote = CliRunner().invoke(cli, [*command, "--gateway", gateway.url], env=env)
            assert remote.exit_code == 0, remote.output
            assert '"active": "v1"' in remote.output
            assert pidfile.exists(), "the gateway ran the hook"
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
    meets = {
        "version": "v3",
        "deployments": ["new"],
        "smoke_samples": str(samples),
        "smoke_count": 4,
        "smoke_slo_ttft_ms": 2000,
    }
    misses = {**meets, "version": "v4", "smoke_slo_ttft_ms": 0.001}
    for body in (meets, misses):
        assert httpx.post(f"{base}/releases", json=body, headers=headers, timeout=10).status_code == 201
    promoted = admin(one, "promote", {"version": "v3"})
    assert promoted.status_code == 200, promoted.text
    refused = admin(one, "promote", {"version": "v4"})
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert "replay smoke run: goodput 0.00 below the required 1: 4 of 4 requests missed ttft<=0.001ms" in message


def smoke_samples(path: Path, **extra: Any) -> Path:
    lines = [{"messages": [{"role": "user", "content": f"smoke {i}"}], **extra} for i in range(4)]
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in lines))
    return path


def test_the_smoke_run_goes_through_the_gateway_pinned_to_the_candidate(setup: dict[str, Any], tmp_path: Path) -> None:
    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    plain = smoke_samples(tmp_path / "plain.jsonl")
    # Requests the model server answers, but the gateway refuses (403): the tool policy forbids
    # the tool they force. A gate that skips the gateway would pass a release its users cannot use.
    email = {"type": "function", "function": {"name": "send_email", "parameters": {"type": "object"}}}
    forcing = smoke_samples(tmp_path / "forcing.jsonl", tools=[email], tool_choice={"type": "function",
                            "function": {"name": "send_email"}})  # fmt: skip
    smoke = {"deployments": ["new"], "system_prompt": "You are v2.", "smoke_count": 4, "smoke_slo_ttft_ms": 5000}
    create(one, version="v3", smoke_samples=str(plain), **smoke)
    create(one, version="v4", smoke_samples=str(forcing), **smoke)

    promoted = admin(one, "promote", {"version": "v3"})
    assert promoted.status_code == 200, promoted.text
    refused = admin(one, "promote", {"version": "v4"})
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert "replay smoke run: 4 of 4 requests failed: http_403" in message, message
    assert "send_email" in message, message
    deadline = time.monotonic() + 10  # the audit writer flushes in the background: poll, bounded
    while True:
        audit = httpx.get(
            f"{one.url}/admin/audit",
            params={"kind": "request", "limit": 1000},
            headers=one.headers(one.admin_key),
            timeout=10,
        ).json()["data"]
        smoked = [r for r in audit if r["release"] == "v3"]
        if len(smoked) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(smoked) >= 4, "the smoke requests went through the gateway, pinned to the candidate"
    assert overview(one)["active"] == "v3"


def test_a_failing_canary_is_rolled_back_automatically(sims: list[Announced], tmp_path: Path) -> None:
    from testkit.procs import set_faults

    config = gateway_config(deployment("old", sims[0]), deployment("new", sims[1], priority=1))
    log_path = tmp_path / "gateway.log"
    with log_path.open("w") as log, gateway_process(tmp_path, config, stderr=log) as gateway:
        base = f"{gateway.url}/admin/models/{MODEL}"
        headers = gateway.headers(gateway.admin_key)
        for version, name in (("v1", "old"), ("v2", "new")):
            body: dict[str, Any] = {"version": version, "deployments": [name]}
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
            statuses.append((reply.status_code, reply.headers.get("X-Gateway-Release")))
            overview = httpx.get(f"{base}/releases", headers=headers, timeout=10).json()
            if overview["canary"] is None:
                break
        assert overview["canary"] is None, "the canary was never rolled back"
        assert overview["active"] == "v1"
        # A request the broken candidate could not answer was answered by the active release.
        assert {status for status, _ in statuses} == {200}, statuses
        assert {release for _, release in statuses} == {"v1"}, statuses
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
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
        aborted = [line for line in metrics.splitlines() if line.startswith("gateway_canary_aborted")]
        assert any('version="v2"' in line and line.endswith(" 1.0") for line in aborted), aborted
    logged = [line for line in log_path.read_text().splitlines() if "ended automatically" in line]
    assert len(logged) == 1, "one log line says the canary was aborted, and why"
    assert "canary v2 of sim-model" in logged[0], logged
    assert "error rate" in logged[0], logged


def create(gateway: Gateway, **spec: Any) -> None:
    url = f"{gateway.url}/admin/models/{MODEL}/releases"
    reply = httpx.post(url, json=spec, headers=gateway.headers(gateway.admin_key), timeout=10)
    assert reply.status_code == 201, reply.text


def overview(gateway: Gateway) -> dict[str, Any]:
    url = f"{gateway.url}/admin/models/{MODEL}/releases"
    reply = httpx.get(url, headers=gateway.headers(gateway.admin_key), timeout=10)
    reply.raise_for_status()
    return dict(reply.json())


def test_rollback_walks_back_through_the_activation_history(setup: dict[str, Any]) -> None:
    one, _ = setup["replicas"]
    create(one, version="v3", deployments=["new"], system_prompt="You are v3.")
    for version in ("v1", "v2", "v3"):
        admin(one, "promote", {"version": version}).raise_for_status()
    assert overview(one)["rollback_target"] == "v2"
    assert admin(one, "rollback", {"reason": "first"}).json()["active"] == "v2"
    assert overview(one)["rollback_target"] == "v1"
    assert admin(one, "rollback", {"reason": "second"}).json()["active"] == "v1"
    third = admin(one, "rollback", {"reason": "third"})
    assert third.status_code == 400, third.text  # never back to the release just rolled back from
    assert overview(one)["active"] == "v1"
    assert overview(one)["rollback_target"] is None
    # Naming a release still works, and promoting again starts a new walk from there.
    assert admin(one, "rollback", {"version": "v3"}).json()["active"] == "v3"
    assert admin(one, "rollback", {}).json()["active"] == "v1"


def test_a_second_plain_rollback_does_not_reactivate_the_release_rolled_back_from(setup: dict[str, Any]) -> None:
    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    admin(one, "promote", {"version": "v2"}).raise_for_status()
    assert admin(one, "rollback", {}).json()["active"] == "v1"
    again = admin(one, "rollback", {})
    assert again.status_code == 400, again.text
    assert "no earlier release" in again.json()["error"]["message"]
    assert overview(one)["active"] == "v1"


def test_a_repeated_rollback_from_the_same_release_rolls_back_once(setup: dict[str, Any]) -> None:
    one, two = setup["replicas"]
    create(one, version="v3", deployments=["new"], system_prompt="You are v3.")
    for version in ("v1", "v2", "v3"):
        admin(one, "promote", {"version": version}).raise_for_status()
    first = admin(one, "rollback", {"expected_active": "v3", "reason": "double click"})
    second = admin(two, "rollback", {"expected_active": "v3", "reason": "double click"})
    assert first.json()["active"] == "v2"
    assert second.status_code == 409, second.text
    assert "v2" in second.json()["error"]["message"]
    assert overview(one)["active"] == "v2"


def eval_set_expecting(path: Path, text: str, case_id: str = "answers-as-v2") -> Path:
    """An eval set whose one case passes only when the release's prompt is in front (the sim's
    answer depends on every message), like a real prompt the model needs to behave."""
    case = {
        "id": case_id,
        "messages": QUESTION,
        "request": {"max_tokens": 6, "temperature": 0},
        "assertions": [{"equals": text}],
    }
    path.write_text(yaml.safe_dump({"id": f"prompted-{case_id}", "version": 1, "cases": [case]}))
    return path


def test_the_eval_gate_runs_through_the_gateway_with_the_candidates_prompt(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    passing = eval_set_expecting(tmp_path / "passing.yaml", setup["texts"]["v2"])
    failing = eval_set_expecting(tmp_path / "failing.yaml", "words the sim never says", "never-said")
    create(one, version="v3", deployments=["new"], system_prompt="You are v2.", eval_set=str(passing))
    create(one, version="v4", deployments=["new"], system_prompt="You are v2.", eval_set=str(failing))

    promoted = admin(one, "promote", {"version": "v3"})
    assert promoted.status_code == 200, promoted.text  # scored 0% against the bare model server
    refused = admin(one, "promote", {"version": "v4"})
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert "case never-said (equals" in message, message  # which case failed, and why
    deadline = time.monotonic() + 10  # the audit writer flushes in the background: poll, bounded
    while True:
        audit = httpx.get(
            f"{one.url}/admin/audit",
            params={"kind": "request", "limit": 1000},
            headers=one.headers(one.admin_key),
            timeout=10,
        ).json()["data"]
        releases = {r["release"] for r in audit}
        if {"v3", "v4"} <= releases or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert {"v3", "v4"} <= releases, "the eval requests went through the gateway, pinned"


def test_an_admin_key_can_address_a_release_that_is_not_active(setup: dict[str, Any]) -> None:
    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 6}
    url = f"{one.url}/v1/chat/completions"
    pinned = httpx.post(url, json=body, headers={**one.headers(one.admin_key), "X-Gateway-Release": "v2"}, timeout=10)
    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["choices"][0]["message"]["content"] == setup["texts"]["v2"]
    assert pinned.headers["X-Gateway-Release"] == "v2"
    plain = httpx.post(url, json=body, headers=one.headers(), timeout=10)
    assert plain.headers["X-Gateway-Release"] == "v1"  # which release answered
    refused = httpx.post(url, json=body, headers={**one.headers(), "X-Gateway-Release": "v2"}, timeout=10)
    assert refused.status_code == 403, refused.text  # a chat key cannot pick a release
    unknown = httpx.post(url, json=body, headers={**one.headers(one.admin_key), "X-Gateway-Release": "v9"}, timeout=10)
    assert unknown.status_code == 404, unknown.text


def test_promotion_refuses_a_checkpoint_the_deployment_does_not_serve(tmp_path: Path) -> None:
    from testkit.procs import start_sim

    registry_root = tmp_path / "registry"
    registry = CheckpointRegistry(registry_root)
    step100 = checkpoint(tmp_path / "ckpt", "ft", 100, registry)
    step200 = checkpoint(tmp_path / "ckpt", "ft", 200, registry)
    serving_200 = start_sim("--served-root", str(step200))  # the server runs step 200
    try:
        reported = httpx.get(f"{serving_200.url}/v1/models", timeout=10).json()["data"][0]
        assert reported["root"] == str(step200)
        config = gateway_config(deployment("ft", serving_200), releases={"checkpoint_registry": str(registry_root)})
        with running_gateway(tmp_path, config) as gateway:
            create(gateway, version="wrong", checkpoint="ft@100")
            create(gateway, version="right", checkpoint="ft@200")
            refused = admin(gateway, "promote", {"version": "wrong"})
            assert refused.status_code == 409, refused.text
            message = refused.json()["error"]["message"]
            assert "serves" in message, message
            assert str(step200) in message, message
            assert str(step100) in message, message
            assert admin(gateway, "promote", {"version": "right"}).status_code == 200
    finally:
        serving_200.stop()


def admin_records(gateway: Gateway, action: str) -> list[dict[str, Any]]:
    records = audit_records(gateway, "admin", lambda found: any(r["action"] == action for r in found), within_s=10)
    return [r for r in records if r["action"] == action]


def test_refused_promotions_and_what_create_and_canary_say_are_audited(setup: dict[str, Any]) -> None:
    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    weights = setup["checkpoints"]["v2"] / "model.safetensors"
    weights.write_bytes(b"corrupted" + weights.read_bytes()[9:])
    assert admin(one, "promote", {"version": "v2", "reason": "try"}).status_code == 409
    refused = admin_records(one, "release.promote.refused")
    assert refused, "a refused promotion is audited"
    assert "model.safetensors" in refused[0]["reason"]
    created = admin_records(one, "release.create")
    assert created
    assert all("active" not in (r["after"] or {}) for r in created), "creating a release activates nothing"
    create(one, version="v3", deployments=["new"], system_prompt="You are v2.")
    canary = {"version": "v3", "share": 0.2, "window_s": 60}
    started = httpx.post(
        f"{one.url}/admin/models/{MODEL}/canary", json=canary, headers=one.headers(one.admin_key), timeout=60
    )
    assert started.status_code == 200, started.text
    record = admin_records(one, "release.canary.start")[0]
    assert record["after"]["canary"] == "v3"
    assert "active" not in record["after"], "a canary does not make its release active"


def test_a_release_pins_its_eval_sets_content_and_the_sets_threshold_applies(
    setup: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, _ = setup["replicas"]
    admin(one, "promote", {"version": "v1"}).raise_for_status()
    workdir = tmp_path / "operator"
    workdir.mkdir()
    request = {"max_tokens": 6}
    cases = [
        {"id": "as-v2", "messages": QUESTION, "request": request, "assertions": [{"equals": setup["texts"]["v2"]}]},
        {"id": "never", "messages": QUESTION, "request": request, "assertions": [{"equals": "no such text"}]},
    ]
    (workdir / "half.yaml").write_text(yaml.safe_dump({"id": "half", "version": 1, "threshold": 0.5, "cases": cases}))
    monkeypatch.chdir(workdir)  # the operator names the set relative to where they are
    created = CliRunner().invoke(
        cli, ["releases", "create", MODEL, "--config", str(setup["config"]), "--version", "v3",
              "--deployments", "new", "--system-prompt", "You are v2.", "--eval-set", "half.yaml"],
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    (workdir / "half.yaml").unlink()  # what the release pinned is its content, not a path
    promoted = admin(one, "promote", {"version": "v3"})  # the file is gone: only the pinned content remains
    assert promoted.status_code == 200, promoted.text  # 1 of 2 passes: the set's own threshold, 50%


def test_readyz_is_not_ready_while_the_active_releases_checkpoint_is_corrupted(
    sim_pair: list[Announced], tmp_path: Path
) -> None:
    registry_root = tmp_path / "registry"
    registry = CheckpointRegistry(registry_root)
    weights_dir = checkpoint(tmp_path / "ckpt", "ft", 100, registry)
    releases = {"checkpoint_registry": str(registry_root), "verify_interval_s": 0.2}
    config = gateway_config(deployment("a", sim_pair[0]), releases=releases)
    with running_gateway(tmp_path, config) as gateway:
        create(gateway, version="v1", checkpoint="ft@100")
        admin(gateway, "promote", {"version": "v1"}).raise_for_status()

        def readiness(wanted: int) -> dict[str, Any]:
            deadline = time.monotonic() + 15
            while True:
                reply = httpx.get(f"{gateway.url}/readyz", timeout=10)
                if reply.status_code == wanted:
                    return dict(reply.json())
                assert time.monotonic() < deadline, reply.text
                time.sleep(0.05)

        readiness(200)
        weights = weights_dir / "model.safetensors"
        good = weights.read_bytes()
        weights.write_bytes(b"x" + good[1:])
        body = readiness(503)
        assert "model.safetensors" in str(body["models"][MODEL]["release"]), body
        weights.write_bytes(good)
        readiness(200)


def test_a_stepped_canary_moves_up_and_promotes_itself(sims: list[Announced], tmp_path: Path) -> None:
    config = gateway_config(
        deployment("old", sims[0]), deployment("new", sims[1], priority=1), releases={"watch_interval_s": 0.05}
    )
    with running_gateway(tmp_path, config) as gateway:
        for version, name in (("v1", "old"), ("v2", "new")):
            create(gateway, version=version, deployments=[name])
        admin(gateway, "promote", {"version": "v1"}).raise_for_status()
        env = {"GATEWAY_ADMIN_KEY": gateway.admin_key}
        started = CliRunner().invoke(
            cli,
            ["releases", "canary", "start", MODEL, "v2", "--steps", "0.3,0.6,1", "--window-s", "1",
             "--min-requests", "2", "--max-latency-ratio", "100", "--gateway", gateway.url],  # equal sims: noise only
            env=env,
        )  # fmt: skip
        assert started.exit_code == 0, started.output
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 3}
        shares, candidate_seen = [], 0
        for _ in range(1000):  # bounded: two windows of 1 s with a few candidate requests each
            reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=10)
            assert reply.status_code == 200, reply.text
            status = httpx.get(
                f"{gateway.url}/admin/models/{MODEL}/canary", headers=gateway.headers(gateway.admin_key), timeout=10
            ).json()
            if status["canary"] is None:
                break
            shares.append(status["canary"]["share"])
            candidate_seen = max(candidate_seen, status["stats"]["candidate"]["requests"])
        assert overview(gateway)["active"] == "v2", "the last step promoted the candidate"
        assert shares[0] == 0.3, shares  # the later step is checked in the audit log (polls may miss it)
        assert candidate_seen > 0, "the live stats counted the candidate's requests"
        shown = CliRunner().invoke(cli, ["releases", "canary", "status", MODEL, "--gateway", gateway.url], env=env)
        assert shown.exit_code == 0, shown.output
        assert "no canary" in shown.output
        steps = admin_records(gateway, "release.canary.step")
        assert [r["after"]["share"] for r in reversed(steps)] == [0.6]
        assert admin_records(gateway, "release.canary.promote")
