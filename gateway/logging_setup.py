"""Structured logs: one JSON object per line on stderr.

Configured by the commands that serve (`gateway serve`, `gateway demo`), never on import, so a
library user or a test keeps its own logging. Every line has `ts`, `level`, `logger`, `message`,
`trace_id` and `span_id` when a span is current, and the record's `extra` fields.

Nothing logged on purpose carries a prompt, a completion or a key; as a second line of defence
the message and any traceback are passed through the audit log's secret redaction.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

import orjson
from opentelemetry import trace

from gateway.audit.stage import redact

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_FIELDS = frozenset(
    {
        "args",
        "asctime",
        "created",
        "exc_info",
        "exc_text",
        "filename",
        "funcName",
        "levelname",
        "levelno",
        "lineno",
        "message",
        "module",
        "msecs",
        "msg",
        "name",
        "pathname",
        "process",
        "processName",
        "relativeCreated",
        "stack_info",
        "taskName",
        "thread",
        "threadName",
    }
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            entry["trace_id"] = trace.format_trace_id(span_context.trace_id)
            entry["span_id"] = trace.format_span_id(span_context.span_id)
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str = "INFO", stream: IO[str] | None = None) -> logging.Handler:
    """Send every logger's records, uvicorn's included, as JSON lines to `stream` (stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # httpx logs every request at INFO: a line per health probe, with URLs that some providers
    # authenticate with a query parameter. The MCP SDK logs every stateless request's session.
    for noisy in ("httpx", "httpcore", "httpx2", "mcp"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    return handler
