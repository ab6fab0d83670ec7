"""deploy/compose.yaml, its gateway config and deploy/Dockerfile: what can be checked without a
container engine (the wiring, the config, the image's user, healthcheck and command)."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.deploy.files import (
    COMPOSE_GATEWAY_CONFIG,
    DEPLOY,
    DOCKERFILE,
    ROOT,
    SECRET_NAMES,
    compose_services,
    dockerfile_instructions,
    env_example,
    environment_without_secrets,
    required_env_references,
)

GATEWAYS = ("gateway-1", "gateway-2")
SIMS = ("sim-1", "sim-2")
CONFIG_IN_CONTAINER = "/etc/agent-gateway/gateway.yaml"


def gateway_config() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE_GATEWAY_CONFIG.read_text(encoding="utf-8")))


def config_check(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "config", "check", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (short syntax, relative to deploy/)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        found[target] = (DEPLOY / source).resolve()
    return found


def sim_port(service: dict[str, Any]) -> int:
    command = service["command"]
    assert command[0] == "sim"
    return int(command[command.index("--port") + 1])


# --- compose ------------------------------------------------------------------------------------


def test_compose_runs_two_gateways_one_redis_a_collector_and_two_sims() -> None:
    assert set(compose_services()) == {*GATEWAYS, "redis", "otel-collector", *SIMS}


def test_both_replicas_mount_the_same_existing_config_file() -> None:
    services = compose_services()
    sources = {mounts(services[name])[CONFIG_IN_CONTAINER] for name in GATEWAYS}
    assert sources == {COMPOSE_GATEWAY_CONFIG.resolve()}
    assert COMPOSE_GATEWAY_CONFIG.is_file()


def test_each_replica_publishes_its_own_port_on_loopback() -> None:
    services = compose_services()
    assert services["gateway-1"]["ports"] == ["127.0.0.1:8081:8080"]
    assert services["gateway-2"]["ports"] == ["127.0.0.1:8082:8080"]
    assert gateway_config()["server"]["port"] == 8080


def test_replicas_start_after_redis_and_the_sims_are_healthy() -> None:
    services = compose_services()
    for name in GATEWAYS:
        assert services[name]["depends_on"] == {
            "redis": {"condition": "service_healthy"},
            "sim-1": {"condition": "service_healthy"},
            "sim-2": {"condition": "service_healthy"},
            "otel-collector": {"condition": "service_started"},
        }
    for dependency in ("redis", *SIMS):
        assert services[dependency]["healthcheck"]["test"][0] == "CMD", dependency


def test_every_service_with_a_shell_or_python_has_a_healthcheck_on_its_own_endpoint() -> None:
    services = compose_services()
    for name in GATEWAYS:
        assert "http://127.0.0.1:8080/healthz" in " ".join(services[name]["healthcheck"]["test"])
    for name in SIMS:
        assert f"http://127.0.0.1:{sim_port(services[name])}/health" in " ".join(services[name]["healthcheck"]["test"])
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_replicas_share_one_redis_that_persists_to_an_append_only_file_on_a_volume() -> None:
    """Issue 12 item 6: a restarted non-persistent Redis deleted every key, silently."""
    services = compose_services()
    store = gateway_config()["store"]
    assert store["kind"] == "redis"
    url = urlsplit(store["url"])
    assert (url.hostname, url.port) == ("redis", 6379)
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "redis-data:/data" in services["redis"]["volumes"]
    assert "redis-data" in yaml.safe_load((DEPLOY / "compose.yaml").read_text())["volumes"]


def test_the_config_reaches_each_sim_and_the_collector_by_service_name() -> None:
    services = compose_services()
    deployments = gateway_config()["models"][0]["deployments"]
    wired = {(urlsplit(d["api_base"]).hostname, urlsplit(d["api_base"]).port) for d in deployments}
    assert wired == {(name, sim_port(services[name])) for name in SIMS}
    for deployment in deployments:
        assert urlsplit(deployment["health_path"]).netloc == urlsplit(deployment["api_base"]).netloc
        assert services[urlsplit(deployment["api_base"]).hostname]["command"][-2:] == ["--host", "0.0.0.0"]

    endpoint = urlsplit(gateway_config()["telemetry"]["otlp_endpoint"])
    assert (endpoint.hostname, endpoint.port) == ("otel-collector", 4318)
    collector_config = mounts(services["otel-collector"])["/etc/otelcol/config.yaml"]
    collector = yaml.safe_load(collector_config.read_text(encoding="utf-8"))
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    for pipeline in ("traces", "metrics"):
        assert collector["service"]["pipelines"][pipeline]["receivers"] == ["otlp"]
        assert collector["service"]["pipelines"][pipeline]["exporters"] == ["debug"]


def test_secrets_come_from_the_environment_and_the_env_example_names_them() -> None:
    services = compose_services()
    for name in GATEWAYS:
        environment = services[name]["environment"]
        assert set(environment) == set(SECRET_NAMES)
        for secret in SECRET_NAMES:
            assert environment[secret].startswith(f"${{{secret}:?"), "compose refuses to start without it"
    assert required_env_references(COMPOSE_GATEWAY_CONFIG.read_text(encoding="utf-8")) == set(SECRET_NAMES)
    assert set(env_example()) == set(SECRET_NAMES)
    assert (DEPLOY / ".gitignore").read_text(encoding="utf-8").splitlines()[-1] == ".env"


def test_every_image_is_pinned_by_tag() -> None:
    for name, service in compose_services().items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:\d[\w.-]*", image), f"{name}: {image} is not pinned to a version tag"


def test_gateways_and_sims_are_built_from_the_repository_dockerfile() -> None:
    services = compose_services()
    for name in (*GATEWAYS, *SIMS):
        build = services[name]["build"]
        assert (DEPLOY / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE
        assert services[name]["read_only"] is True


# --- the compose gateway config -----------------------------------------------------------------


def test_the_compose_config_passes_config_check_with_the_env_example_secrets() -> None:
    checked = config_check(COMPOSE_GATEWAY_CONFIG, {**environment_without_secrets(), **env_example()})
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip().endswith("ok (1 models, 2 deployments, store redis)")


def test_the_compose_config_is_refused_without_its_secrets() -> None:
    checked = config_check(COMPOSE_GATEWAY_CONFIG, environment_without_secrets())
    assert checked.returncode == 2
    assert "auth.admin_key: environment variable GATEWAY_ADMIN_KEY is not set" in checked.stderr
    assert "tools.approval_secret: environment variable GATEWAY_APPROVAL_SECRET is not set" in checked.stderr


# --- Dockerfile ---------------------------------------------------------------------------------


def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions split at each FROM (global ARGs before the first are dropped)."""
    split: list[list[tuple[str, str]]] = []
    for keyword, arguments in dockerfile_instructions():
        if keyword == "FROM":
            split.append([])
        if split:
            split[-1].append((keyword, arguments))
    return split


def test_the_image_is_built_in_one_stage_and_runs_in_another_from_a_pinned_base() -> None:
    build, runtime = stages()
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE} AS runtime")
    (base,) = [args for keyword, args in dockerfile_instructions() if keyword == "ARG" and "PYTHON_IMAGE=" in args]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11\.\d+-slim-\w+", base), base
    assert any(keyword == "RUN" and "pip wheel" in args for keyword, args in build)
    assert ("COPY", "--from=build /opt/agent-gateway /opt/agent-gateway") in runtime


def test_the_image_runs_as_a_non_root_user() -> None:
    _, runtime = stages()
    users = [args for keyword, args in runtime if keyword == "USER"]
    assert users, "the runtime stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit(), "numeric, so Kubernetes' runAsNonRoot can verify it"
    assert any(keyword == "RUN" and f"--uid {user}" in args for keyword, args in runtime)


def test_the_image_healthcheck_asks_healthz_with_python_alone() -> None:
    _, runtime = stages()
    (healthcheck,) = [args for keyword, args in runtime if keyword == "HEALTHCHECK"]
    command = json.loads(healthcheck[healthcheck.index("CMD") + len("CMD") :])
    assert command[:2] == ["python", "-c"]
    assert "http://127.0.0.1:8080/healthz" in command[2]
    assert "curl" not in healthcheck


def test_the_image_serves_the_mounted_config_on_all_interfaces_at_8080() -> None:
    _, runtime = stages()
    instructions = dict(runtime)
    assert instructions["EXPOSE"] == "8080"
    command = json.loads(instructions["ENTRYPOINT"]) + json.loads(instructions["CMD"])
    assert command == ["gateway", "serve", "--config", CONFIG_IN_CONTAINER, "--host", "0.0.0.0"]


def test_the_image_copies_every_package_the_wheel_is_built_from() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(
        path.name
        for path in ROOT.iterdir()
        if (path / "__init__.py").is_file() and any(fnmatch.fnmatch(path.name, p) for p in patterns)
    )
    assert packages
    build, _ = stages()
    copied = {args.split()[0] for keyword, args in build if keyword == "COPY"}
    assert copied >= {*packages, "pyproject.toml"}
    assert project["project"]["readme"] in " ".join(args for keyword, args in build if keyword == "COPY")
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    assert not set(ignored) & {*packages, "pyproject.toml", "README.md"}, "the context must keep what is copied"
