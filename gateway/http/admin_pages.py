"""The admin web pages (static files that call the admin API with the key a person types in, sent
with headers that keep them from being framed or running foreign code) and the admin-only schema."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib.resources import files

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.auth.stage import Authenticator
from gateway.core.principal import Scope
from gateway.errors import NotFound

_PAGES = {
    "approvals": ("approvals.html", "text/html; charset=utf-8"),
    "releases": ("releases.html", "text/html; charset=utf-8"),
    "admin.js": ("admin.js", "text/javascript; charset=utf-8"),
}


_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.S)


def security_headers(body: bytes) -> dict[str, str]:
    """A page holding a person's admin key in its script: nothing but its own code runs (inline
    blocks are allowed by hash, not wholesale), it cannot be framed, and no URL leaks onward."""
    allowed: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for kind, block in _INLINE.findall(body):
        allowed[kind].append(f"'sha256-{base64.b64encode(hashlib.sha256(block).digest()).decode()}'")
    scripts = " ".join(["'self'", *allowed[b"script"]])
    styles = " ".join(allowed[b"style"]) or "'none'"
    csp = (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }


async def _page(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _PAGES:
        raise NotFound(f"no admin page '{name}'")
    filename, media_type = _PAGES[name]
    body = files("gateway.http.admin_ui").joinpath(filename).read_bytes()
    return Response(body, media_type=media_type, headers=security_headers(body))


def admin_page_routes() -> list[BaseRoute]:
    return [Route("/admin/ui/{name}", _page, methods=["GET"])]


def openapi_routes(app: FastAPI, authenticator: Authenticator) -> list[BaseRoute]:
    """`GET /openapi.json` for admin keys only: the schema is a map of every admin endpoint."""

    async def schema(request: Request) -> Response:
        principal = await authenticator.authenticate(request.headers)
        principal.require(Scope.ADMIN)
        return JSONResponse(app.openapi())

    return [Route("/openapi.json", schema, methods=["GET"])]
