import functools
from typing import Any

import httpx
import pytest

from gateway.releases.served import Adapter, adapter_to_load, mismatches, same_checkpoint, served_name
from gateway.settings import DeploymentSettings, LoadHook

LORA = {"kind": "lora", "lora_name": "tiny-ft"}


def test_a_checkpoint_is_the_same_wherever_the_registry_is_mounted() -> None:
    assert same_checkpoint("/mnt/models/tiny/step-200/", "/srv/registry/runs/tiny/step-200")
    assert not same_checkpoint("/srv/runs/tiny/step-300", "/srv/runs/tiny/step-200")
    assert not same_checkpoint("/srv/runs/other/step-200", "/srv/runs/tiny/step-200")


def test_only_deployments_that_report_other_weights_are_mismatches() -> None:
    served = {"a": "/r/tiny/step-200", "b": "/r/tiny/step-100", "sim": None}
    assert mismatches("/r/tiny/step-200", served) == [
        "deployment b serves /r/tiny/step-100, not the pinned checkpoint /r/tiny/step-200"
    ]


def test_a_lora_deployment_is_looked_up_by_its_adapter_name() -> None:
    base = {"name": "d", "api_base": "http://127.0.0.1:1/v1", "model": "base"}
    assert served_name(DeploymentSettings.model_validate(base)) == "base"
    lora = {**base, "load_hook": {"kind": "lora", "lora_name": "tiny-ft"}}
    assert served_name(DeploymentSettings.model_validate(lora)) == "tiny-ft"


@pytest.mark.parametrize(
    ("hook", "listed", "to_load"),
    [
        (LORA, {"tiny-ft": "/r/tiny-lora/step-2"}, Adapter.TO_LOAD),  # another one
        (LORA, {}, Adapter.TO_LOAD),  # none under the name
        (LORA, {"tiny-ft": "/mnt/tiny-lora/step-1"}, Adapter.SERVED),
        ({"kind": "command", "command": ["true"]}, {"base": "/r/tiny-lora/step-2"}, Adapter.SERVED),  # not an adapter
    ],
)
async def test_a_lora_deployment_needs_its_adapter_loaded_when_the_engine_lists_another(
    monkeypatch: pytest.MonkeyPatch, hook: dict[str, Any], listed: dict[str, str], to_load: Adapter
) -> None:
    """An engine that is up says nothing about its adapters: /v1/models decides."""
    models = {"data": [{"id": name, "root": root} for name, root in {"base": "/r/base", **listed}.items()]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=models))
    monkeypatch.setattr(
        "gateway.releases.served.httpx.AsyncClient", functools.partial(httpx.AsyncClient, transport=transport)
    )
    deployment = DeploymentSettings(
        name="ft", api_base="http://127.0.0.1:1/v1", model="base", load_hook=LoadHook.model_validate(hook)
    )
    assert await adapter_to_load(deployment, "/r/tiny-lora/step-1") is to_load
    assert await adapter_to_load(deployment, None) is Adapter.SERVED, "nothing pinned: nothing to load"


@pytest.mark.parametrize("reply", [httpx.Response(503, text="busy"), httpx.Response(200, text="not json")])
async def test_an_engine_whose_listing_fails_is_not_reloaded_but_reported_unknown(
    monkeypatch: pytest.MonkeyPatch, reply: httpx.Response
) -> None:
    """A transient /v1/models failure on a healthy engine must not trigger an in-place load."""
    transport = httpx.MockTransport(lambda request: reply)
    monkeypatch.setattr(
        "gateway.releases.served.httpx.AsyncClient", functools.partial(httpx.AsyncClient, transport=transport)
    )
    hook = {"kind": "lora", "lora_name": "tiny-ft"}
    deployment = DeploymentSettings(
        name="ft", api_base="http://127.0.0.1:1/v1", model="base", load_hook=LoadHook.model_validate(hook)
    )
    assert await adapter_to_load(deployment, "/r/tiny-lora/step-1") is Adapter.UNKNOWN
