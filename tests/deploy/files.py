"""The deployment artefacts under deploy/, loaded for the tests of this folder."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_GATEWAY_CONFIG = DEPLOY / "compose" / "gateway.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
ENV_EXAMPLE = DEPLOY / ".env.example"

SECRET_NAMES = ("GATEWAY_ADMIN_KEY", "GATEWAY_APPROVAL_SECRET")


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def compose_services() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"])


def env_example() -> dict[str, str]:
    """KEY=value lines of deploy/.env.example."""
    pairs = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def environment_without_secrets() -> dict[str, str]:
    """This process's environment less anything a gateway config could read as its secrets."""
    return {k: v for k, v in os.environ.items() if k not in SECRET_NAMES}


def required_env_references(text: str) -> set[str]:
    """Names of `${VAR}` references without a `:-default`."""
    return {m.group(1) for m in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)}


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, comments dropped and continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions
