"""The one place where exceptions become HTTP responses, always in OpenAI's error shape."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from common.problems import key_path
from gateway.errors import GatewayError, StoreCorrupt
from gateway.ids import RandomIds, request_id_from

log = logging.getLogger(__name__)

# FastAPI's first part of a request error's location: where in the request, not a key of the body.
_REQUEST_PARTS = frozenset({"body", "query", "path"})
_HTTP_CODES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


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


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def gateway_error_response(error: GatewayError) -> Response:
    headers = error.headers()
    if error.request_id is not None:
        headers = {**headers, "X-Request-Id": error.request_id}
    return _json(error.status, gateway_error_body(error), headers)


def error_response_for(request: Request, error: GatewayError, ids: RandomIds) -> Response:
    """A route's error, named by the request's id when the route did not name it (admin, sessions)."""
    if isinstance(error, StoreCorrupt):
        # The operator's cue: which record and why (the client is told which record only).
        log.error("%s %s: %s", request.method, request.url.path, error.message)
    if error.request_id is None and error.status >= 500:
        error.request_id = request_id_from(request.headers, ids)
    return gateway_error_response(error)


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error_type, code = _HTTP_CODES.get(exc.status_code, ("invalid_request_error", f"http_{exc.status_code}"))
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return _json(exc.status_code, error_body(message, error_type, code), dict(exc.headers or {}))


async def _on_validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = key_path(first["loc"], skip=_REQUEST_PARTS.__contains__)
    return _json(
        400,
        error_body(f"Invalid value for '{param}': {first['msg']}", "invalid_request_error", "invalid_value", param),
    )


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    # A bug, not bad input: log it with its traceback and answer in the shape clients parse.
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _json(500, error_body(INTERNAL_ERROR, "api_error", "internal_error"))


def install_error_handlers(app: FastAPI) -> None:
    ids = RandomIds()

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response_for(request, exc, ids)

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
