"""Errors as clients see them: OpenAI's error shape, rendered in one place for every writer (the
HTTP error handlers, both stream writers, the MCP endpoint), so that a 5xx body and an in-band
error event say the same thing and both name the request."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.responses import Response

from gateway.errors import GatewayError, StoreCorrupt

# The name it logged under when it lived in gateway/http/errors.py: operators filter by it.
log = logging.getLogger("gateway.http.errors")


INTERNAL_ERROR = "Internal error in the gateway"


def error_body(message: str, error_type: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def gateway_error_body(error: GatewayError) -> dict[str, Any]:
    """The client's view of `error`. A server-side one names its request, and its detail (which
    the client is never told) is logged under that id: the one place both happen, so every 5xx
    body and in-band error event, whoever renders it, can be traced to its cause."""
    message = error.public_message
    if error.status >= 500 and error.request_id is not None:
        message = f"{message} (request {error.request_id})"
        log.warning("request %s failed: %s (%s)", error.request_id, error.message, error.code)
    return error_body(message, error.type, error.code, error.param)


def stream_failure(exc: Exception) -> GatewayError:
    """What a stream that failed after its first chunk tells its client, in band: a GatewayError
    as it is; anything else is a bug, logged with its traceback and told as an internal error (the
    in-band 500). Both stream writers use it: the session producer and the sessionless stream."""
    if isinstance(exc, StoreCorrupt):
        log.error("a stream failed after its first chunk: %s", exc.message)
    if isinstance(exc, GatewayError):
        return exc
    log.error("a stream failed after its first chunk", exc_info=exc)
    return GatewayError(INTERNAL_ERROR)


def error_json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def gateway_error_response(error: GatewayError) -> Response:
    headers = error.headers()
    if error.request_id is not None:
        headers = {**headers, "X-Request-Id": error.request_id}
    return error_json(error.status, gateway_error_body(error), headers)
