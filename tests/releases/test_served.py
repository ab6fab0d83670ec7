import functools
from typing import Any

import httpx
import pytest

from gateway.releases import served
from gateway.releases.served import adapter_to_load, mismatches, same_checkpoint, served_name
from gateway.settings import DeploymentSettings


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
        ({"kind": "lora", "lora_name": "tiny-ft"}, {"tiny-ft": "/r/tiny-lora/step-2"}, True),  # another adapter
        ({"kind": "lora", "lora_name": "tiny-ft"}, {}, True),  # none under the name
        ({"kind": "lora", "lora_name": "tiny-ft"}, {"tiny-ft": "/mnt/tiny-lora/step-1"}, False),
        ({"kind": "command", "command": ["true"]}, {"base": "/r/tiny-lora/step-2"}, False),  # not an adapter
    ],
)
async def test_a_lora_deployment_needs_its_adapter_loaded_when_the_engine_lists_another(
    monkeypatch: pytest.MonkeyPatch, hook: dict[str, Any], listed: dict[str, str], to_load: bool
) -> None:
    """An engine that is up says nothing about its adapters: /v1/models decides."""
    models = {"data": [{"id": name, "root": root} for name, root in {"base": "/r/base", **listed}.items()]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=models))
    monkeypatch.setattr(served.httpx, "AsyncClient", functools.partial(httpx.AsyncClient, transport=transport))
    deployment = DeploymentSettings(name="ft", api_base="http://127.0.0.1:1/v1", model="base", load_hook=hook)
    assert await adapter_to_load(deployment, "/r/tiny-lora/step-1") is to_load
    assert await adapter_to_load(deployment, None) is False, "nothing pinned: nothing to load"
