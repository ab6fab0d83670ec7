from gateway.releases.served import mismatches, same_checkpoint, served_name
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
