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

log = logging.getLogger(__name__)

# FastAPI's first part of a request error's location: where in the request, not a key of the body.
_REQUEST_PARTS = frozenset({"body", "query", "path"})
_HTTP_CODES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


INTERNAL_ERROR = "Internal error in the gateway"


def error_body(message: str, error_type: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def gateway_error_body(error: GatewayError) -> dict[str, Any]:
    return error_body(error.public_message, error.type, error.code, error.param)


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
    return _json(error.status, gateway_error_body(error), error.headers())


async def on_gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    if isinstance(exc, StoreCorrupt):
        # The operator's cue: which record and why (the client is told which record only).
        log.error("%s %s: %s", request.method, request.url.path, exc.message)
    return gateway_error_response(exc)


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
    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
