"""High 1: a deeply nested body is a 400 naming the limit, taken before anything is reserved; it
never leaks an audit slot (the gateway kept hanging after `audit.queue_size` such requests)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from testkit.procs import Gateway
from tests.security.helpers import CHAT, admin_get, assert_openai_error, audit_count, chat, nested

DEEP = 300  # past orjson's 255-level encoder limit, under its 1024-level decoder limit


def test_high1_deep_messages_are_400_naming_the_limit(gateway: Gateway) -> None:
    content = [{"type": "text", "text": "hi", "deep": nested(DEEP)}]
    reply = chat(gateway, {**CHAT, "messages": [{"role": "user", "content": content}]})
    error = assert_openai_error(reply, 400, "json_too_deep")
    assert "64" in error["message"]  # the limit in force, named


def test_high1_deep_bodies_never_leak_an_audit_slot(gateway: Gateway) -> None:
    before = audit_count(gateway)
    body = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "d": nested(DEEP)}]}]}
    for _ in range(12):  # three times the audit queue of this gateway
        assert_openai_error(chat(gateway, body), 400, "json_too_deep")
    assert chat(gateway, timeout=15).status_code == 200  # was: hangs for good
    verdict = admin_get(gateway, "/audit/verify")
    assert verdict["ok"], verdict
    assert verdict["checked"] >= before + 13  # every refusal was recorded, and the answer


def test_low_deep_passthrough_parameter_is_400_before_quota(gateway: Gateway) -> None:
    _, secret = gateway.create_key(rpm=3)
    for _ in range(3):
        assert_openai_error(chat(gateway, {**CHAT, "vendor_extension": nested(DEEP)}, key=secret), 400, "json_too_deep")
    for _ in range(3):  # the refusals took none of the key's requests per minute
        assert chat(gateway, key=secret).status_code == 200


def test_high1_nesting_within_the_limit_is_served(gateway: Gateway) -> None:
    reply = chat(gateway, {**CHAT, "vendor_extension": nested(40)})
    assert reply.status_code == 200, reply.text


def test_high1_oversized_body_is_413_without_reading_it(gateway: Gateway) -> None:
    reply = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=b"[" * (11 * 1024 * 1024),
        headers={**gateway.headers(), "content-type": "application/json"},
        timeout=30,
    )
    assert_openai_error(reply, 413, "request_too_large")


def test_high1_deep_nesting_flood_keeps_other_tenants_answered(gateway: Gateway) -> None:
    """One tenant floods deep bodies from several connections at once (far more than the audit
    queue holds); another tenant is answered throughout, and after."""
    _, attacker = gateway.create_key(tenant="acme")
    _, victim = gateway.create_key(tenant="globex")
    body = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "d": nested(DEEP)}]}]}
    flood_size = 120

    def attack(_: int) -> int:
        return chat(gateway, body, key=attacker, timeout=30).status_code

    with ThreadPoolExecutor(8) as pool:
        flood = pool.map(attack, range(flood_size))  # submitted at once; eight at a time in flight
        answered = [chat(gateway, key=victim, timeout=30).status_code]  # while the flood runs
        statuses = list(flood)
        answered.append(chat(gateway, key=victim, timeout=30).status_code)
    assert statuses == [400] * flood_size
    assert answered == [200, 200]
    assert admin_get(gateway, "/audit/verify")["ok"]
