"""The approval secret as configured (a string, `tools.approval_secret`) or as bytes: both work."""

from __future__ import annotations

import time

import pytest

from policies import arguments_sha256, issue_approval_token, verify_approval_token

SECRET = "test-approval-secret-0123456789"
ARGUMENTS = '{"to": "a@example.com"}'


@pytest.mark.parametrize(
    ("issued_with", "verified_with"), [(SECRET, SECRET), (SECRET.encode(), SECRET), (SECRET, SECRET.encode())]
)
def test_the_configured_string_and_its_bytes_are_the_same_secret(
    issued_with: str | bytes, verified_with: str | bytes
) -> None:
    token = issue_approval_token(issued_with, "appr_1", "send_email", arguments_sha256(ARGUMENTS), time.time() + 60)
    assert verify_approval_token(token, verified_with, "send_email", ARGUMENTS).approval_id == "appr_1"


def test_a_short_string_secret_is_refused_by_its_utf8_length() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        verify_approval_token("x.y", "short", "send_email", ARGUMENTS)
