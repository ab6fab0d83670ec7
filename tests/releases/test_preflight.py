"""A rollback's LoRA load is the traffic switch on its engine: it runs only after every check that
changes nothing passed, and a rollback refused after it gives the engine back what it served."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from checkpoints.registry import CheckpointRegistry
from gateway.core.principal import Limits, Principal
from gateway.errors import Conflict, StoreUnavailable
from gateway.releases.active import ActiveReleases
from gateway.releases.preflight import Preflight, PreflightFailed
from gateway.releases.service import ReleaseService
from gateway.settings import DeploymentSettings, LoadHook, LoadHookKind
from gateway.store.release_record import CheckpointPin, PromptPin, Release, SmokePin

ADAPTER = "tiny-ft"


class Engine:
    """A vLLM engine as far as a rollback sees it: its adapter listing and in-place loads."""

    def __init__(self, root: str | None, broken_by: str | None = None) -> None:
        self.root = root
        self.loads: list[str] = []
        self.broken_by = broken_by  # loading this adapter leaves the engine unhealthy
        self.listing_fails = False
        self.up = True

    def healthy(self) -> bool:
        return self.up and (self.broken_by is None or self.root != self.broken_by)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        action = request.url.path.rsplit("/", 1)[-1]
        if action == "models" and self.listing_fails:
            return httpx.Response(503, text="busy")
        if action == "models":
            listed = [{"id": ADAPTER, "root": self.root}] if self.root else []
            return httpx.Response(200, json={"data": [{"id": "base", "root": "/base"}, *listed]})
        body = json.loads(request.content)
        if action == "load_lora_adapter":
            self.loads.append(body["lora_path"])
            self.root = body["lora_path"]
        elif action == "unload_lora_adapter":
            self.root = None
        return httpx.Response(200, text="Success")


class Checks(Preflight):
    def __init__(self, engines: dict[str, Engine], hooked: str, candidate: Any = None) -> None:
        hook = LoadHook(kind=LoadHookKind.LORA, lora_name=ADAPTER, timeout_s=0.5)
        self.deployments = [
            SimpleNamespace(
                name=name,
                engine=engine,
                settings=DeploymentSettings(
                    name=name,
                    api_base=f"http://{name}.test/v1",
                    model="base",
                    load_hook=hook if name == hooked else None,
                ),
            )
            for name, engine in engines.items()
        ]
        super().__init__(SimpleNamespace(probe=self._probe), self._group_of, candidate, run_load_hooks=True)  # type: ignore[arg-type]

    async def _probe(self, deployment: Any) -> bool:
        return bool(deployment.engine.healthy())

    def _group_of(self, model: str) -> Any:
        return SimpleNamespace(deployments=self.deployments)


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> dict[str, Engine]:
    """Engines by host; every request of the hooks and the listings goes to them."""
    found: dict[str, Engine] = {}

    def route(request: httpx.Request) -> httpx.Response:
        return found[request.url.host.removesuffix(".test")](request)

    client = functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(route))
    monkeypatch.setattr(httpx, "AsyncClient", client)
    return found


def release(registry: CheckpointRegistry, version: str, deployments: tuple[str, ...]) -> Release:
    entry = registry.get(version)
    pin = CheckpointPin(version=version, path=entry.path, manifest_digest=entry.manifest_digest)
    return Release(
        model="m",
        version=version,
        deployments=deployments,
        prompt=PromptPin(version="", system_prompt="", sha256=""),
        created_at=0.0,
        checkpoint=pin,
    )


@pytest.fixture
def registry(tmp_path: Path) -> CheckpointRegistry:
    registry = CheckpointRegistry(tmp_path / "registry")
    for step in (100, 200):
        path = tmp_path / "tiny-lora" / f"step-{step}"
        path.mkdir(parents=True)
        (path / "adapter_config.json").write_text('{"r": 8}')
        (path / "adapter_model.safetensors").write_bytes(bytes([step % 256]) * 4096)
        registry.register(path, "tiny-lora", step)
    return registry


def corrupt(path: Path) -> None:
    path.write_bytes(b"corrupted")


def path_of(registry: CheckpointRegistry, version: str) -> str:
    return registry.get(version).path


async def test_a_rollback_to_a_checkpoint_that_fails_verification_never_loads_it(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    serving = path_of(registry, "tiny-lora@200")
    engines["ft"] = Engine(serving)
    corrupt(Path(path_of(registry, "tiny-lora@100"), "adapter_model.safetensors"))
    with pytest.raises(PreflightFailed, match="checkpoint tiny-lora@100"):
        await Checks(engines, hooked="ft")(release(registry, "tiny-lora@100", ("ft",)), run_evals=False, bring_up=True)
    assert engines["ft"].loads == [], "a checkpoint that failed verification was loaded into the engine"
    assert engines["ft"].root == serving


async def test_a_rollback_refused_for_another_unhealthy_deployment_never_loads(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    serving = path_of(registry, "tiny-lora@200")
    engines["ft"] = Engine(serving)
    engines["down"] = Engine(None)
    engines["down"].up = False
    with pytest.raises(PreflightFailed, match="deployment down is not healthy"):
        await Checks(engines, hooked="ft")(
            release(registry, "tiny-lora@100", ("ft", "down")), run_evals=False, bring_up=True
        )
    assert engines["ft"].loads == []
    assert engines["ft"].root == serving


async def test_a_rollback_refused_after_its_load_gives_the_engine_back_its_adapter_and_says_so(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    serving, target = path_of(registry, "tiny-lora@200"), path_of(registry, "tiny-lora@100")
    engines["ft"] = Engine(serving, broken_by=target)  # the target's adapter leaves it unhealthy
    with pytest.raises(PreflightFailed) as refused:
        await Checks(engines, hooked="ft")(release(registry, "tiny-lora@100", ("ft",)), run_evals=False, bring_up=True)
    assert engines["ft"].loads == [target, serving]
    assert engines["ft"].root == serving
    assert f"deployment ft now serves {serving}" in refused.value.message, refused.value.message


async def test_a_refused_rollback_unloads_an_adapter_the_name_did_not_hold_before(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    target = path_of(registry, "tiny-lora@100")
    engines["ft"] = Engine(None, broken_by=target)
    with pytest.raises(PreflightFailed) as refused:
        await Checks(engines, hooked="ft")(release(registry, "tiny-lora@100", ("ft",)), run_evals=False, bring_up=True)
    assert engines["ft"].root is None
    assert "deployment ft now serves no adapter under its name" in refused.value.message


async def test_a_rollback_whose_engine_cannot_list_its_adapters_loads_nothing(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    serving = path_of(registry, "tiny-lora@200")
    engines["ft"] = Engine(serving)
    engines["ft"].listing_fails = True
    with pytest.raises(PreflightFailed, match="did not list its models"):
        await Checks(engines, hooked="ft")(release(registry, "tiny-lora@100", ("ft",)), run_evals=False, bring_up=True)
    assert engines["ft"].loads == []


Switch = Callable[..., Awaitable[dict[str, Any]]]


def rollback_service(switch: Switch, checks: Checks, record: Release, active: str | Exception) -> ReleaseService:
    """A service over a store holding `record`, whose active release reads as `active`, and whose
    switches all go to `switch`."""

    async def release_get(model: str, version: str) -> Release:
        return record

    async def release_active(model: str) -> tuple[str, int]:
        if isinstance(active, Exception):
            raise active
        return active, 7

    router = SimpleNamespace(groups={"m": checks._group("m")})
    store = SimpleNamespace(release_get=release_get, release_active=release_active)
    service = ReleaseService(store, None, router, checks._health, None, ActiveReleases())  # type: ignore[arg-type]
    service.switchboard.switch = switch  # type: ignore[method-assign,assignment]
    return service


ADMIN = Principal("key_admin", "*", frozenset({"admin"}), frozenset(), Limits(), all_tenants=True)


async def losing_switch(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Another switch keeps landing first: the compare-and-set is lost."""
    raise Conflict("m: the active release keeps changing; try again")


async def test_a_rollback_that_loses_its_switch_gives_the_engine_back_its_adapter(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    serving, target = path_of(registry, "tiny-lora@200"), path_of(registry, "tiny-lora@100")
    engines["ft"] = Engine(serving)
    checks = Checks(engines, hooked="ft")
    record = release(registry, "tiny-lora@100", ("ft",))
    service = rollback_service(losing_switch, checks, record, "tiny-lora@200")
    with pytest.raises(Conflict) as lost:
        await service.rollback(ADMIN, "m", to_version="tiny-lora@100")
    assert engines["ft"].loads == [target, serving]
    assert engines["ft"].root == serving
    assert f"deployment ft now serves {serving}" in lost.value.message, lost.value.message


def hanging_switch(entered: asyncio.Event) -> Switch:
    """The switch never returns (a stalled store): the caller gives up and cancels."""

    async def switch(*args: Any, **kwargs: Any) -> dict[str, Any]:
        entered.set()
        await asyncio.Future()  # until cancelled
        raise AssertionError("unreachable")

    return switch


async def test_a_rollback_cancelled_between_its_load_and_the_switch_gives_the_engine_back_its_adapter(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    serving, target = path_of(registry, "tiny-lora@200"), path_of(registry, "tiny-lora@100")
    engines["ft"] = Engine(serving)
    checks = Checks(engines, hooked="ft")
    entered = asyncio.Event()
    record = release(registry, "tiny-lora@100", ("ft",))
    service = rollback_service(hanging_switch(entered), checks, record, "tiny-lora@200")
    rollback = asyncio.ensure_future(service.rollback(ADMIN, "m", to_version="tiny-lora@100"))
    await asyncio.wait_for(entered.wait(), timeout=10)
    assert engines["ft"].root == target  # loaded: on this engine the load is the switch
    rollback.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rollback
    assert engines["ft"].loads == [target, serving]
    assert engines["ft"].root == serving


async def failing_switch(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The store fails the switch's write; whether it landed is for the store to say."""
    raise StoreUnavailable("redis: release_activate failed: Timeout reading from 127.0.0.1:6379")


@pytest.mark.parametrize(
    ("active", "given_back"),
    [("tiny-lora@200", True), ("tiny-lora@100", False), (StoreUnavailable("redis: down"), False)],
    ids=["not-switched", "switched-before-the-error", "store-cannot-say"],
)
async def test_a_rollback_whose_switch_fails_gives_back_only_when_the_switch_did_not_land(
    engines: dict[str, Engine], registry: CheckpointRegistry, active: str | Exception, given_back: bool
) -> None:
    serving, target = path_of(registry, "tiny-lora@200"), path_of(registry, "tiny-lora@100")
    engines["ft"] = Engine(serving)
    checks = Checks(engines, hooked="ft")
    service = rollback_service(failing_switch, checks, release(registry, "tiny-lora@100", ("ft",)), active)
    with pytest.raises(StoreUnavailable, match="release_activate"):
        await service.rollback(ADMIN, "m", to_version="tiny-lora@100")
    assert engines["ft"].root == (serving if given_back else target)


class HangingListing(Checks):
    """The engine accepts the load, then its listing never answers: the caller cancels."""

    listing: asyncio.Event

    async def _served(self, record: Release) -> Any:
        self.listing.set()
        await asyncio.Future()


async def test_a_preflight_cancelled_after_its_load_gives_the_engine_back_its_adapter(
    engines: dict[str, Engine], registry: CheckpointRegistry
) -> None:
    serving, target = path_of(registry, "tiny-lora@200"), path_of(registry, "tiny-lora@100")
    engines["ft"] = Engine(serving)
    checks = HangingListing(engines, hooked="ft")
    checks.listing = asyncio.Event()
    preflight = asyncio.ensure_future(
        checks(release(registry, "tiny-lora@100", ("ft",)), run_evals=False, bring_up=True)
    )
    await asyncio.wait_for(checks.listing.wait(), timeout=10)
    assert engines["ft"].root == target
    preflight.cancel()
    with pytest.raises(asyncio.CancelledError):
        await preflight
    assert engines["ft"].loads == [target, serving]
    assert engines["ft"].root == serving


class Unbindable:
    """A socket the kernel will not bind (every port taken, or no loopback)."""

    def __init__(self, *args: Any) -> None:
        pass

    def bind(self, address: Any) -> None:
        raise OSError(98, "Address already in use")

    def close(self) -> None:
        pass


async def test_a_preflight_listener_that_cannot_start_is_a_named_refusal_not_a_crash(
    engines: dict[str, Engine], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A refusal (PreflightFailed) is what gets audited; any other error was a bare 500."""
    from gateway.http import candidate_listener

    unbindable = SimpleNamespace(socket=Unbindable, AF_INET=socket.AF_INET, SOCK_STREAM=socket.SOCK_STREAM)
    monkeypatch.setattr(candidate_listener, "socket", unbindable)
    engines["ft"] = Engine(None)
    candidate = SimpleNamespace(listener=lambda actor, version: candidate_listener.serve_once(None))  # type: ignore[arg-type]
    checks = Checks(engines, hooked="", candidate=candidate)
    record = Release(
        model="m",
        version="v2",
        deployments=("ft",),
        prompt=PromptPin(version="", system_prompt="", sha256=""),
        created_at=0.0,
        smoke=SmokePin(samples=str(tmp_path / "samples.jsonl"), count=1),
    )
    with pytest.raises(PreflightFailed, match=r"replay smoke run: the local listener did not start: .*in use"):
        await checks(record, run_evals=False, actor=ADMIN)
