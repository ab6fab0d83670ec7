"""The one place where exceptions become HTTP responses, always in OpenAI's error shape."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from common.problems import key_path
from gateway.core.error_bodies import INTERNAL_ERROR, error_body, error_json, gateway_error_response
from gateway.errors import GatewayError, StoreCorrupt
from gateway.ids import RandomIds, request_id_from

log = logging.getLogger(__name__)

# FastAPI's first part of a request error's location: where in the request, not a key of the body.
_REQUEST_PARTS = frozenset({"body", "query", "path"})
_HTTP_CODES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


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
    return error_json(exc.status_code, error_body(message, error_type, code), dict(exc.headers or {}))


async def _on_validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = key_path(first["loc"], skip=_REQUEST_PARTS.__contains__)
    return error_json(
        400,
        error_body(f"Invalid value for '{param}': {first['msg']}", "invalid_request_error", "invalid_value", param),
    )


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    # A bug, not bad input: log it with its traceback and answer in the shape clients parse.
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_json(500, error_body(INTERNAL_ERROR, "api_error", "internal_error"))


def install_error_handlers(app: FastAPI) -> None:
    ids = RandomIds()

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response_for(request, exc, ids)

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
