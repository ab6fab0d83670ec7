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
