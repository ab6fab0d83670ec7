"""`POST /v1/messages/count_tokens`: what a Messages request's prompt would cost, without asking a model.

The gateway does not know a backend's tokenizer, so the count is its own estimate, the one the
quota reserves before a request runs (about four characters a token, `gateway/tokens.py`), of the
request as the backend would get it (its system prompt, messages and tools in the chat form).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.auth.stage import Authenticator
from gateway.core.principal import Scope
from gateway.errors import GatewayError
from gateway.http.openai_api import surface_error_response
from gateway.http.requests import read_body
from gateway.settings import ServerSettings
from gateway.surfaces.chat_request import decode_json
from gateway.surfaces.messages import MESSAGES, Messages
from gateway.surfaces.messages_request import translate
from gateway.tokens import estimate_prompt_tokens
from gateway.wire import dumps


class MessagesApi:
    def __init__(self, authenticator: Authenticator, server: ServerSettings) -> None:
        """A body to count is a body to send: the same limits on its size, depth and arrival."""
        self._authenticator = authenticator
        self._server = server
        self._surface = Messages()

    def routes(self) -> list[BaseRoute]:
        return [Route(MESSAGES + "/count_tokens", self.count_tokens, methods=["POST"])]

    async def count_tokens(self, request: Request) -> Response:
        try:
            principal = await self._authenticator.authenticate(request.headers)
            principal.require(Scope.CHAT)
            server = self._server
            body = await read_body(request, server.max_body_bytes, server.body_timeout_s)
            payload = decode_json(body, server.max_json_depth)
            if isinstance(payload, dict):
                payload = {"max_tokens": 1, **payload}  # counting needs no output limit
            translated = translate(payload)
        except GatewayError as error:
            return surface_error_response(self._surface, error)
        return Response(dumps({"input_tokens": estimate_prompt_tokens(translated.chat)}), media_type="application/json")
