"""deploy/k8s: every manifest is valid Kubernetes (strict JSON schemas, offline), the kustomization
applies all of them, and the pieces refer to each other correctly."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.deploy.files import K8S, SECRET_NAMES, environment_without_secrets, required_env_references, yaml_documents

KUBERNETES_VERSION = "1.37"
MANIFESTS = sorted(path for path in K8S.glob("*.yaml") if path.name != "kustomization.yaml")
CLUSTER_SCOPED = {"Namespace"}


def resources() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in MANIFESTS:
        for doc in yaml_documents(path):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{key} defined twice"
            found[key] = doc
    return found


def one(kind: str, name: str) -> dict[str, Any]:
    return resources()[(kind, name)]


def gateway_config_text() -> str:
    return str(one("ConfigMap", "agent-gateway-config")["data"]["gateway.yaml"])


def workloads() -> list[dict[str, Any]]:
    return [doc for (kind, _), doc in resources().items() if kind in ("Deployment", "StatefulSet")]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_the_folder_holds_the_expected_resources() -> None:
    assert set(resources()) >= {
        ("Namespace", "agent-gateway"),
        ("ConfigMap", "agent-gateway-config"),
        ("Secret", "agent-gateway-secrets"),
        ("Deployment", "agent-gateway"),
        ("Service", "agent-gateway"),
        ("PodDisruptionBudget", "agent-gateway"),
        ("HorizontalPodAutoscaler", "agent-gateway"),
        ("StatefulSet", "redis"),
        ("Service", "redis"),
    }


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_every_manifest_validates_against_the_strict_kubernetes_schemas(path: Path) -> None:
    documents = yaml_documents(path)
    assert documents, f"{path.name} is empty"
    for doc in documents:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {error.message} at {list(error.path)}")


def test_strict_validation_would_catch_a_misspelt_field() -> None:
    deployment = copy.deepcopy(one("Deployment", "agent-gateway"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")  # the typo a schema-less check misses
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest_and_nothing_else() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == [path.name for path in MANIFESTS]
    assert kustomization["namespace"] == "agent-gateway"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed")
def test_kustomize_builds_every_resource_into_the_namespace() -> None:
    built = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    documents = [doc for doc in yaml.safe_load_all(built.stdout) if doc is not None]
    assert {(doc["kind"], doc["metadata"]["name"]) for doc in documents} == set(resources())
    for doc in documents:
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == "agent-gateway", doc["metadata"]
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_configmap_gateway_config_passes_config_check_with_the_example_secrets(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(gateway_config_text(), encoding="utf-8")
    secrets = one("Secret", "agent-gateway-secrets")["stringData"]
    checked = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "check", str(path)],
        env={**environment_without_secrets(), **secrets},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    assert "store redis" in checked.stdout


def test_the_secret_supplies_every_variable_the_config_requires_and_holds_only_placeholders() -> None:
    secret = one("Secret", "agent-gateway-secrets")
    assert set(secret["stringData"]) == set(SECRET_NAMES)
    assert required_env_references(gateway_config_text()) == set(SECRET_NAMES)
    for value in secret["stringData"].values():
        assert "REPLACE-ME" in value, "the committed Secret is an example: it must not look like a real secret"


def test_every_host_the_config_names_is_a_service_of_the_kustomization() -> None:
    config = yaml.safe_load(gateway_config_text())
    services = {name: doc for (kind, name), doc in resources().items() if kind == "Service"}
    urls = [config["store"]["url"]]
    for model in config["models"]:
        for deployment in model["deployments"]:
            urls += [deployment["api_base"], deployment["health_path"]]
    for url in urls:
        parts = urlsplit(url)
        assert parts.hostname in services, f"{url}: no Service named {parts.hostname}"
        assert parts.port in [port["port"] for port in services[parts.hostname]["spec"]["ports"]], url


def test_the_gateway_deployment_runs_three_replicas_with_probes_config_and_secrets() -> None:
    deployment = one("Deployment", "agent-gateway")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["args"] == ["serve", "--config", "/etc/agent-gateway/gateway.yaml", "--host", "0.0.0.0"]
    assert {"containerPort": 8080, "name": "http", "protocol": "TCP"} in container["ports"]
    assert container["envFrom"] == [{"secretRef": {"name": "agent-gateway-secrets"}}]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]

    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    config_volume = volumes[mounts["/etc/agent-gateway"]["name"]]
    assert config_volume["configMap"]["name"] == "agent-gateway-config"
    assert [item["path"] for item in config_volume["configMap"]["items"]] == ["gateway.yaml"]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]], "/tmp is writable on a read-only root filesystem"

    spread = pod["topologySpreadConstraints"]
    assert {constraint["topologyKey"] for constraint in spread} >= {"kubernetes.io/hostname"}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(selects(constraint["labelSelector"]["matchLabels"], pod_labels) for constraint in spread)


@pytest.mark.parametrize("workload", workloads(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_every_pod_runs_as_non_root_on_a_read_only_root_filesystem(workload: dict[str, Any]) -> None:
    """The namespace enforces the `restricted` Pod Security Standard; these are its rules."""
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert not pod.get("hostNetwork")
    assert not pod.get("hostPID")
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert ":" in container["image"], "images pinned by tag"
        assert not container["image"].endswith(":latest"), "images pinned by tag"
    namespace = one("Namespace", "agent-gateway")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_service_budget_and_autoscaler_all_target_the_gateway_pods() -> None:
    deployment = one("Deployment", "agent-gateway")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)

    service = one("Service", "agent-gateway")
    assert selects(service["spec"]["selector"], pod_labels)
    assert service["spec"]["ports"][0]["targetPort"] == "http"

    budget = one("PodDisruptionBudget", "agent-gateway")
    assert selects(budget["spec"]["selector"]["matchLabels"], pod_labels)
    assert budget["spec"]["minAvailable"] == 2

    autoscaler = one("HorizontalPodAutoscaler", "agent-gateway")
    assert autoscaler["apiVersion"] == "autoscaling/v2"
    assert autoscaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "agent-gateway",
    }
    (metric,) = autoscaler["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    # A drain must always be able to evict one pod: fewer replicas than the budget would block it.
    assert autoscaler["spec"]["minReplicas"] > budget["spec"]["minAvailable"]


def test_redis_statefulset_is_reachable_under_the_name_the_config_uses() -> None:
    statefulset = one("StatefulSet", "redis")
    service = one("Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "the StatefulSet's governing Service is headless"
    assert selects(service["spec"]["selector"], statefulset["spec"]["template"]["metadata"]["labels"])
    store_url = urlsplit(yaml.safe_load(gateway_config_text())["store"]["url"])
    assert (store_url.hostname, store_url.port) == (service["metadata"]["name"], 6379)
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    assert [claim["metadata"]["name"] for claim in statefulset["spec"]["volumeClaimTemplates"]] == ["data"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"  # issue 12 item 6: state survives a restart
    assert args[args.index("--appendfsync") + 1] == "everysec"
