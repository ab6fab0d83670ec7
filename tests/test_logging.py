"""Structured logs: JSON lines with trace ids, and never a prompt, a completion or a key."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.trace import StatusCode

from gateway.errors import UpstreamProtocolError
from gateway.logging_setup import JsonFormatter, configure_logging
from tests.doubles import Script, ScriptedBackend
from tests.telemetry_app import PROMPT, traced_gateway


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    """Root logging as `gateway serve` sets it up, into a buffer; the test run's own setup restored after."""
    root, quieted = logging.getLogger(), [logging.getLogger(name) for name in ("httpx", "httpcore")]
    saved = root.handlers[:], root.level, [q.level for q in quieted]
    stream = io.StringIO()
    configure_logging("debug", stream)  # answered requests are logged at DEBUG
    try:
        yield stream
    finally:
        root.handlers = saved[0]
        root.setLevel(saved[1])
        for logger, level in zip(quieted, saved[2], strict=True):
            logger.setLevel(level)


async def test_request_log_lines_carry_the_trace_and_no_content_or_key(tmp_path: Path, log_output: io.StringIO) -> None:
    async with traced_gateway(tmp_path, ScriptedBackend("a", Script(tokens=["Sunny", " skies"]))) as gateway:
        assert (await gateway.chat()).status_code == 200
        assert (await gateway.chat(stream=True)).status_code == 200
        assert (await gateway.chat(key="agw_not-a-key-of-anyone-at-all-0000")).status_code == 401
        trace_ids = [f"{s.context.trace_id:032x}" for s in gateway.server_spans()]
        span_ids = [f"{s.context.span_id:016x}" for s in gateway.server_spans()]
        secrets = (gateway.key, gateway.admin_key)

    text = log_output.getvalue()
    lines = [json.loads(line) for line in text.splitlines()]
    requests = [line for line in lines if line["message"] == "chat completion"]
    assert [(r["status"], r["trace_id"], r["span_id"]) for r in requests] == list(
        zip([200, 200, 401], trace_ids, span_ids, strict=True)
    )
    assert requests[0]["logger"] == "gateway.requests"
    assert [r["level"] for r in requests] == ["DEBUG", "DEBUG", "INFO"]  # answered, answered, refused
    assert requests[0]["model"] == "m"
    assert requests[0]["deployment"] == "a"
    assert requests[0]["completion_tokens"] == 2
    assert requests[0]["ts"].endswith("+00:00")
    for secret in (PROMPT, "Sunny", *secrets, "agw_not-a-key-of-anyone-at-all-0000"):
        assert secret not in text


def test_a_secret_in_a_message_or_a_traceback_is_redacted() -> None:
    key = "agw_" + "x" * 40
    logger = logging.getLogger("gateway.test_logging")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        try:
            raise ValueError(f"bad key {key}")
        except ValueError:
            logger.exception("rejected %s", key, extra={"tenant": "acme"})
    finally:
        logger.removeHandler(handler)
    entry = json.loads(stream.getvalue())
    assert key not in stream.getvalue()
    assert entry["message"] == "rejected [REDACTED]"
    assert "ValueError: bad key [REDACTED]" in entry["exception"]
    assert entry["tenant"] == "acme"
    assert "trace_id" not in entry  # no span is current here


async def test_a_stream_cut_for_good_is_a_warning_and_an_error_span(tmp_path: Path, log_output: io.StringIO) -> None:
    cut = ScriptedBackend("a", Script(tokens=["one", " two"], error=UpstreamProtocolError("cut"), fail_after=1))
    async with traced_gateway(tmp_path, cut, routing={"max_failovers": 0}) as gateway:
        reply = await gateway.chat(stream=True)
        assert reply.status_code == 200
        assert "stream_interrupted" in reply.text
        (server,) = gateway.server_spans()

    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200  # what the client got, before the in-band error
    assert server.attributes["gateway.failure_reason"] == "protocol_error"
    (line,) = [json.loads(line) for line in log_output.getvalue().splitlines() if "chat completion" in line]
    assert (line["level"], line["error"], line["failure_reason"]) == ("WARNING", "stream_interrupted", "protocol_error")
