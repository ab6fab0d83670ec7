"""`POST /v1/chat/completions` straight to its handler; every other request to the app's router.

Between the server and a route, FastAPI passes each request through its exception middleware, an
exit stack, the router's match against every route and the route's own wrappers (one more for
each send): ~3% of a request's CPU (py-spy at c=1), for a route that uses none of them (no
dependencies, no path parameters). This middleware sits inside the server-error middleware and
answers that one route itself: its `GatewayError`s are mapped by `errors.py` as the exception
middleware would have; anything else goes up to the server-error middleware, as before. The route
stays in the router too, which answers its other methods (405) and describes it in the schema.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.http.errors import error_response_for
from gateway.http.openai_api import OpenAIApi
from gateway.ids import RandomIds
from gateway.surfaces.chat_completions import CHAT_COMPLETIONS


class ChatCompletionsFirst:
    def __init__(self, app: ASGIApp, api: OpenAIApi) -> None:
        self._app = app
        self._api = api
        self._ids = RandomIds()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or _route_path(scope) != CHAT_COMPLETIONS:
            await self._app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self._api.chat_completions(request)
        except GatewayError as error:
            response = error_response_for(request, error, self._ids)
        await response(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path the router would match: without the root path the app is mounted under."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
