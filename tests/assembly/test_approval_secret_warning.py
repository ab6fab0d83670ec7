"""The gateway warns at start only about features the config uses."""

from __future__ import annotations

import logging

import pytest

from gateway.assembly.tools import approval_secret
from gateway.settings import parse_settings

MODELS = [{"name": "m", "deployments": [{"name": "d", "api_base": "http://127.0.0.1:9/v1", "model": "m"}]}]


def test_no_approval_secret_warning_without_tools(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        approval_secret(parse_settings({"models": MODELS}))
    assert "approval_secret" not in caplog.text


def test_a_tool_policy_without_approval_secret_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        approval_secret(parse_settings({"models": MODELS, "tools": {"policy_file": "policies/examples/demo.yaml"}}))
    assert "tools.approval_secret is not set" in caplog.text
