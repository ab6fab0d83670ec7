"""Builds the backend a deployment's `kind` names; litellm is imported only if a deployment needs it."""

from __future__ import annotations

from gateway.backends.base import Backend
from gateway.backends.openai_compat import OpenAICompatBackend
from gateway.settings import BackendKind, DeploymentSettings


def build_backend(deployment: DeploymentSettings) -> Backend:
    if deployment.kind is BackendKind.LITELLM:
        # litellm costs seconds and ~190 MB at import: pay that only when it is configured.
        from gateway.backends.litellm_adapter import LiteLLMBackend

        return LiteLLMBackend(deployment)
    return OpenAICompatBackend(deployment)
