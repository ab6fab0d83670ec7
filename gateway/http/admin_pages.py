"""The admin web pages: static files that call the admin API with the key a person types in."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.errors import NotFound

_PAGES = {
    "approvals": ("approvals.html", "text/html; charset=utf-8"),
    "releases": ("releases.html", "text/html; charset=utf-8"),
    "admin.js": ("admin.js", "text/javascript; charset=utf-8"),
}


async def _page(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _PAGES:
        raise NotFound(f"no admin page '{name}'")
    filename, media_type = _PAGES[name]
    return Response(files("gateway.http.admin_ui").joinpath(filename).read_bytes(), media_type=media_type)


def admin_page_routes() -> list[BaseRoute]:
    return [Route("/admin/ui/{name}", _page, methods=["GET"])]
