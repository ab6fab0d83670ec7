"""`/v1/sessions/{id}`: resume a stream, read a transcript, end a session."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.auth.stage import Authenticator
from gateway.core.principal import Principal, Scope
from gateway.errors import InvalidRequest
from gateway.http.streamed_response import StreamedResponse
from gateway.ids import RandomIds, request_id_from
from gateway.sessions.manager import SessionManager
from gateway.wire import dumps

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# ASCII digits only (str.isdigit() also takes '²' and other scripts' digits, which int() refuses),
# and few enough of them to fit every store's integer.
_SEQ = re.compile(r"^[0-9]{1,15}$")


class SessionsApi:
    def __init__(self, sessions: SessionManager, authenticator: Authenticator) -> None:
        self._sessions = sessions
        self._authenticator = authenticator
        self._ids = RandomIds()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/sessions/{session_id}/stream", self.resume, methods=["GET"]),
            Route("/v1/sessions/{session_id}", self.show, methods=["GET"]),
            Route("/v1/sessions/{session_id}", self.delete, methods=["DELETE"]),
        ]

    async def _caller(self, request: Request) -> Principal:
        principal = await self._authenticator.authenticate(request.headers)
        principal.require(Scope.CHAT)
        return principal

    async def resume(self, request: Request) -> Response:
        """The events after `Last-Event-ID` (or `?after=`), then the live tail, until [DONE]."""
        principal = await self._caller(request)
        after = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        if not _SEQ.match(after):
            raise InvalidRequest("Last-Event-ID must be a sequence number (1-15 digits)", param="Last-Event-ID")
        session_id = request.path_params["session_id"]
        request_id = request_id_from(request.headers, self._ids)
        frames = await self._sessions.resume(principal, session_id, int(after), request_id)
        headers = {**_SSE_HEADERS, "X-Session-Id": session_id}
        return StreamedResponse(frames, media_type="text/event-stream", headers=headers)

    async def show(self, request: Request) -> Response:
        principal = await self._caller(request)
        transcript = await self._sessions.transcript(principal, request.path_params["session_id"])
        return Response(dumps(transcript), media_type="application/json")

    async def delete(self, request: Request) -> Response:
        principal = await self._caller(request)
        session_id = request.path_params["session_id"]
        await self._sessions.delete(principal, session_id)
        return Response(
            dumps({"id": session_id, "object": "session.deleted", "deleted": True}), media_type="application/json"
        )
