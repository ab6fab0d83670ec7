"""`/v1/responses/{id}`: a kept response, its input items, its event stream again, its
cancellation (a background response made on this replica), its deletion.

A response is a session named by its id (gateway/sessions/kept.py), so reading its events again
(`?stream=true&starting_after=N`) is a session resume: from this replica's memory, the store, or
a takeover of a dead replica's stream. Event `sequence_number` N is the session log's event N+1.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.auth.stage import Authenticator
from gateway.core.principal import Principal, Scope
from gateway.errors import InvalidRequest
from gateway.http.streamed_response import StreamedResponse
from gateway.ids import RandomIds, request_id_from
from gateway.sessions.manager import SessionManager
from gateway.surfaces.responses import RESPONSES
from gateway.wire import dumps

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_NUMBER = re.compile(r"^[0-9]{1,15}$")  # ASCII digits that fit every store's integer
_MAX_PAGE = 100


class ResponsesApi:
    def __init__(self, sessions: SessionManager, authenticator: Authenticator) -> None:
        self._sessions = sessions
        self._authenticator = authenticator
        self._ids = RandomIds()

    def routes(self) -> list[BaseRoute]:
        return [
            Route(RESPONSES + "/{response_id}", self.retrieve, methods=["GET"]),
            Route(RESPONSES + "/{response_id}", self.delete, methods=["DELETE"]),
            Route(RESPONSES + "/{response_id}/input_items", self.input_items, methods=["GET"]),
            Route(RESPONSES + "/{response_id}/cancel", self.cancel, methods=["POST"]),
        ]

    async def _caller(self, request: Request) -> Principal:
        principal = await self._authenticator.authenticate(request.headers)
        principal.require(Scope.CHAT)
        return principal

    async def retrieve(self, request: Request) -> Response:
        principal = await self._caller(request)
        response_id = request.path_params["response_id"]
        if _flag(request, "stream"):
            return await self._stream(request, principal, response_id)
        kept = await self._sessions.kept_answer(principal, response_id)
        return Response(dumps(kept.answer), media_type="application/json")

    async def _stream(self, request: Request, principal: Principal, response_id: str) -> Response:
        """The events after `starting_after` (all of them without it), then the live tail."""
        given = request.query_params.get("starting_after")
        if given is not None and not _NUMBER.match(given):
            raise InvalidRequest("'starting_after' must be a sequence number", param="starting_after")
        after_seq = 0 if given is None else int(given) + 1
        request_id = request_id_from(request.headers, self._ids)
        frames = await self._sessions.resume(principal, response_id, after_seq, request_id)
        return StreamedResponse(frames, media_type="text/event-stream", headers=_SSE_HEADERS)

    async def cancel(self, request: Request) -> Response:
        principal = await self._caller(request)
        kept = await self._sessions.cancel_kept(principal, request.path_params["response_id"])
        return Response(dumps(kept.answer), media_type="application/json")

    async def delete(self, request: Request) -> Response:
        principal = await self._caller(request)
        response_id = request.path_params["response_id"]
        await self._sessions.delete_kept(principal, response_id)
        body = {"id": response_id, "object": "response", "deleted": True}
        return Response(dumps(body), media_type="application/json")

    async def input_items(self, request: Request) -> Response:
        """A page of the items the response was made from, its chain's included, as OpenAI lists
        them: `order` desc (newest first) unless asc, `limit` 1-100 (20), `after`/`before` an id."""
        principal = await self._caller(request)
        kept = await self._sessions.kept_answer(principal, request.path_params["response_id"])
        items = list(kept.input_items)
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("'order' must be 'asc' or 'desc'", param="order")
        if order == "desc":
            items.reverse()
        page = _page(items, request.query_params.get("after"), request.query_params.get("before"))
        limit = _limit(request.query_params.get("limit"))
        body = {
            "object": "list",
            "data": page[:limit],
            "first_id": page[0]["id"] if page else None,
            "last_id": page[:limit][-1]["id"] if page else None,
            "has_more": len(page) > limit,
        }
        return Response(dumps(body), media_type="application/json")


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name, "false").lower()
    if value not in ("true", "false"):
        raise InvalidRequest(f"'{name}' must be true or false", param=name)
    return value == "true"


def _limit(given: str | None) -> int:
    if given is None:
        return 20
    if not _NUMBER.match(given) or not 1 <= int(given) <= _MAX_PAGE:
        raise InvalidRequest(f"'limit' must be a number from 1 to {_MAX_PAGE}", param="limit")
    return int(given)


def _page(items: list[dict[str, Any]], after: str | None, before: str | None) -> list[dict[str, Any]]:
    """The items strictly after `after` and strictly before `before` (ids), in the listing's order."""
    ids = [item.get("id") for item in items]
    for cursor, name in ((after, "after"), (before, "before")):
        if cursor is not None and cursor not in ids:
            raise InvalidRequest(f"'{name}' is not an item of this response: {cursor!r}", param=name)
    start = ids.index(after) + 1 if after is not None else 0
    end = ids.index(before) if before is not None else len(items)
    return items[start:end]
