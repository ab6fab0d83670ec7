"""Config errors name the bad key and never quote a secret."""

from __future__ import annotations

import pytest

from gateway.settings import ConfigError, parse_settings


def config_with_key(api_key: str) -> dict[str, object]:
    deployment = {"name": "a", "api_base": "http://127.0.0.1:9/v1", "model": "m", "api_key": api_key}
    return {"models": [{"name": "m", "deployments": [deployment]}]}


@pytest.mark.parametrize("api_key", ["sk-abc\r\nx-evil: 1", "two words", "clé-secrète", "tab\there"])
def test_an_upstream_key_that_cannot_be_sent_as_a_header_is_refused_naming_it(api_key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_settings(config_with_key(api_key))
    message = str(refused.value)
    assert "models[0].deployments[0].api_key: " in message
    assert "HTTP header" in message
    assert api_key not in message


def test_an_upstream_key_of_printable_ascii_is_accepted() -> None:
    key = "sk-proj_AZaz09.~!#$%&'*+-/=?^`|{}"
    settings = parse_settings(config_with_key(key))
    assert settings.models[0].deployments[0].api_key == key


@pytest.mark.parametrize("health_path", ["ftp://upstream.test/health", "localhost:8000/health", "http:///health"])
def test_a_health_path_that_is_neither_a_path_nor_an_http_url_is_refused_naming_it(health_path: str) -> None:
    config = config_with_key("")
    config["models"][0]["deployments"][0]["health_path"] = health_path  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"models\[0\]\.deployments\[0\]\.health_path: must be a path"):
        parse_settings(config)


@pytest.mark.parametrize("health_path", ["/models", "health?next=http://x", "http://127.0.0.1:8000/health"])
def test_a_health_path_may_be_a_path_or_an_http_url(health_path: str) -> None:
    config = config_with_key("")
    config["models"][0]["deployments"][0]["health_path"] = health_path  # type: ignore[index]
    assert parse_settings(config).models[0].deployments[0].health_path == health_path
