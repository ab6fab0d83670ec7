from __future__ import annotations

import re
import time

import pytest

from policies import (
    ApprovalClaims,
    InvalidApprovalToken,
    MalformedArguments,
    arguments_sha256,
    issue_approval_token,
    verify_approval_token,
)

SECRET = b"s" * 32
ARGUMENTS = '{"amount": 120.5, "order_id": "ord_42", "meta": {"channel": "chat", "agent": 7}}'
NOW = 1_700_000_000.0


def _token(arguments: str = ARGUMENTS, tool: str = "refund_payment", expires_at: float = NOW + 60) -> str:
    return issue_approval_token(SECRET, "apr_1", tool, arguments_sha256(arguments), expires_at)


def _rejected(token: str, arguments: str = ARGUMENTS, tool: str = "refund_payment", secret: bytes = SECRET) -> str:
    with pytest.raises(InvalidApprovalToken) as caught:
        verify_approval_token(token, secret, tool, arguments, now=NOW)
    return caught.value.code


def test_a_token_verifies_for_the_call_it_approved() -> None:
    claims = verify_approval_token(_token(), SECRET, "refund_payment", ARGUMENTS, now=NOW)
    assert claims == ApprovalClaims("apr_1", "refund_payment", arguments_sha256(ARGUMENTS), NOW + 60)


def test_the_token_is_two_base64url_parts() -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}", _token())


def test_verification_uses_the_clock_when_no_time_is_given() -> None:
    token = _token(expires_at=time.time() + 60)
    assert verify_approval_token(token, SECRET, "refund_payment", ARGUMENTS).approval_id == "apr_1"


@pytest.mark.parametrize(
    "same_call",
    [
        '{"order_id": "ord_42", "meta": {"agent": 7, "channel": "chat"}, "amount": 120.5}',
        '{\n  "amount": 120.5,\n  "order_id": "ord_42",\n  "meta": {"channel": "chat", "agent": 7}\n}',
        '{"amount":120.5,"order_id":"ord_42","meta":{"channel":"chat","agent":7}}',
        '{"amount": 1.205e2, "order_id": "ord_\\u0034\\u0032", "meta": {"channel": "chat", "agent": 7}}',
    ],
)
def test_reordered_keys_or_whitespace_are_not_tampering(same_call: str) -> None:
    assert verify_approval_token(_token(), SECRET, "refund_payment", same_call, now=NOW).tool == "refund_payment"


@pytest.mark.parametrize(
    "changed_call",
    [
        '{"amount": 1205, "order_id": "ord_42", "meta": {"channel": "chat", "agent": 7}}',
        '{"amount": 120.5, "order_id": "ord_43", "meta": {"channel": "chat", "agent": 7}}',
        '{"amount": 120.5, "order_id": "ord_42", "meta": {"channel": "chat", "agent": 8}}',
        '{"amount": 120.5, "order_id": "ord_42", "meta": {"channel": "chat", "agent": "7"}}',
        '{"amount": 120.5, "order_id": "ord_42", "meta": {"channel": "chat", "agent": 7}, "notify": false}',
        '{"amount": 120.5, "order_id": "ord_42"}',
    ],
)
def test_any_changed_argument_value_is_detected(changed_call: str) -> None:
    assert _rejected(_token(), arguments=changed_call) == "arguments_changed"


@pytest.mark.parametrize(
    "unusable",
    ["{", "", '{"amount": 1, "amount": 120.5, "order_id": "ord_42"}', '{"amount": 1e999}'],
)
def test_arguments_the_tool_server_cannot_read_unambiguously_are_refused(unusable: str) -> None:
    assert _rejected(_token(), arguments=unusable) == "arguments_changed"


def test_a_token_for_another_tool_is_refused() -> None:
    assert _rejected(_token(), tool="close_account") == "wrong_tool"


def test_an_expired_token_is_refused() -> None:
    assert _rejected(_token(expires_at=NOW)) == "expired"
    assert _rejected(_token(expires_at=NOW - 1)) == "expired"


def test_a_token_signed_with_another_secret_is_refused() -> None:
    assert _rejected(_token(), secret=b"t" * 32) == "bad_mac"


def test_claims_changed_after_signing_are_refused() -> None:
    # Claims for other arguments with the original MAC: the arguments hash is covered by the MAC.
    forged_claims, _ = _token(arguments='{"amount": 999}').split(".")
    _, mac = _token().split(".")
    assert _rejected(f"{forged_claims}.{mac}", arguments='{"amount": 999}') == "bad_mac"


@pytest.mark.parametrize(
    "garbage",
    ["", "abc", "a.b.c", "!!!.???", "é.é", "x" * 10_000, ".", "eyJ2IjoxfQ.", "eyJ2IjoxfQ==.AAAA"],
)
def test_garbage_tokens_are_refused_as_malformed(garbage: str) -> None:
    assert _rejected(garbage) == "malformed"


def test_a_non_canonical_spelling_of_a_valid_mac_is_refused() -> None:
    encoded, mac = _token().split(".")
    # The last base64 character of a 32-byte MAC carries 2 unused bits; flipping one keeps the bytes.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    respelled = mac[:-1] + alphabet[alphabet.index(mac[-1]) ^ 1]
    assert _rejected(f"{encoded}.{respelled}") == "malformed"


def test_the_arguments_hash_ignores_form_but_not_values() -> None:
    assert arguments_sha256('{"a": 1, "b": [1, 2]}') == arguments_sha256('{"b":[1,2],"a":1}')
    assert arguments_sha256('{"a": 1, "b": [1, 2]}') != arguments_sha256('{"a": 1, "b": [2, 1]}')
    assert len(arguments_sha256("{}")) == 64
    with pytest.raises(MalformedArguments):
        arguments_sha256("{not json")


@pytest.mark.parametrize(
    ("secret", "digest", "expires_at"),
    [
        (b"short", "0" * 64, NOW),
        (SECRET, '{"amount": 1}', NOW),
        (SECRET, "0" * 64, float("nan")),
        (SECRET, "0" * 64, float("inf")),
    ],
)
def test_issuing_refuses_a_weak_secret_a_raw_argument_string_or_a_bad_expiry(
    secret: bytes, digest: str, expires_at: float
) -> None:
    with pytest.raises(ValueError, match=r"secret|arguments_sha256|expires_at"):
        issue_approval_token(secret, "apr_1", "refund_payment", digest, expires_at)
