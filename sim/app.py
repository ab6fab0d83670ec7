"""The simulated OpenAI-compatible backend as an ASGI app.

Routes:
  POST /v1/chat/completions   streamed or not; honours process faults and the X-Sim-Fault header
  POST /v1/embeddings         deterministic vectors (sim/embeddings.py)
  GET  /v1/models             the profile's model ids (a body that never ends under `drip_health`)
  GET  /health                200, or the process status fault (>= 500), a stall, or a drip
  GET  /sim/control           current faults, counters and profile
  PUT  /sim/control/faults    replace the process faults (JSON object of Faults fields)
  POST /sim/control/reset     back to the profile's faults, counters zeroed
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from sim.embeddings import EmbeddingsError, embed
from sim.faults import FAULT_HEADER, FaultError, Faults, faults_from_mapping, parse_faults
from sim.profile import SimProfile
from sim.reply import RequestError, plan_reply
from sim.respond import ChatResponse, DripResponse, StallResponse
from sim.state import SimState
from sim.wire import dumps, error_body

__all__ = ["SimProfile", "create_sim_app"]

_JSON = "application/json"


def create_sim_app(profile: SimProfile | None = None) -> Starlette:
    """A fresh sim app; its mutable state lives in `app.state.sim` (a `SimState`)."""
    state = SimState(profile if profile is not None else SimProfile())
    handlers = _Handlers(state)
    routes = [
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", handlers.embeddings, methods=["POST"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/sim/control", handlers.control, methods=["GET"]),
        Route("/sim/control/faults", handlers.put_faults, methods=["PUT"]),
        Route("/sim/control/reset", handlers.reset, methods=["POST"]),
    ]
    # Clients of an OpenAI-compatible server expect JSON errors even for unknown routes.
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.sim = state
    return app


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(dumps(payload), status_code=status, media_type=_JSON)


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    return Response(error_body(message, status, param), status_code=status, media_type=_JSON, headers=headers)


def _with_length(body: object, faults: Faults) -> object:
    """The body as a backend that ignores the client's limit and writes `faults.length` tokens sees it."""
    if faults.length is None or not isinstance(body, dict):
        return body
    unlimited = {k: v for k, v in body.items() if k not in ("max_tokens", "max_completion_tokens")}
    return {**unlimited, "max_tokens": faults.length}


def fault_status_response(faults: Faults) -> Response:
    """The error a `status` fault asks for, with Retry-After hints when `retry_after` is set."""
    status = faults.status if faults.status is not None else 500
    headers = None
    if faults.retry_after is not None:
        # Retry-After for standards-minded clients, retry-after-ms (as OpenAI sends) for sub-second.
        headers = {
            "retry-after": f"{faults.retry_after:g}",
            "retry-after-ms": str(round(faults.retry_after * 1000)),
        }
    return error_response(status, f"simulated HTTP {status}", headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return error_response(status, f"{detail}: {request.method} {request.url.path}")


class _Handlers:
    """Route endpoints bound to one app's state, so no module holds mutable state."""

    def __init__(self, state: SimState) -> None:
        self._state = state
        self._created = int(time.time())

    async def chat_completions(self, request: Request) -> Response | ChatResponse:
        state = self._state
        state.counters.requests += 1
        response = await self._chat(request)
        if isinstance(response, Response):
            state.record_status(response.status_code)
        else:
            state.record_status(200)
        return response

    async def _chat(self, request: Request) -> Response | ChatResponse:
        header = request.headers.get(FAULT_HEADER)
        try:
            faults = self._state.faults if header is None else parse_faults(header)
        except FaultError as exc:
            return error_response(400, str(exc), param="X-Sim-Fault")
        if faults.status is not None:
            self._state.record_fault("status")
            return fault_status_response(faults)
        if self._state.roll_error(faults.error_rate):
            self._state.record_fault("error_rate")
            return error_response(500, "simulated random server error")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return error_response(400, "request body is not valid JSON")
        except ClientDisconnect:
            return Response(status_code=499)
        try:
            reply = plan_reply(_with_length(body, faults), echo_tool_results=self._state.profile.echo_tool_results)
        except RequestError as exc:
            return error_response(400, exc.message, param=exc.param)
        if faults.length is not None and reply.tool_call is None:
            reply = dataclasses.replace(reply, finish_reason="stop")  # it ignored the limit: no "length"
        if faults.usage is not None:
            reply = dataclasses.replace(reply, reported_usage=faults.usage)
        return ChatResponse(self._state, reply, faults)

    async def embeddings(self, request: Request) -> Response:
        """Deterministic embeddings (sim/embeddings.py); the X-Sim-Fault status and error rate apply."""
        state = self._state
        state.counters.requests += 1
        header = request.headers.get(FAULT_HEADER)
        try:
            faults = state.faults if header is None else parse_faults(header)
        except FaultError as exc:
            return error_response(400, str(exc), param="X-Sim-Fault")
        if faults.status is not None:
            state.record_fault("status")
            return fault_status_response(faults)
        try:
            answer = embed(orjson.loads(await request.body()))
        except orjson.JSONDecodeError:
            return error_response(400, "request body is not valid JSON")
        except EmbeddingsError as exc:
            return error_response(400, exc.message, param=exc.param)
        except ClientDisconnect:
            return Response(status_code=499)
        state.record_status(200)
        return Response(orjson.dumps(answer), media_type="application/json")

    async def models(self, request: Request) -> Response | DripResponse:
        if self._state.faults.drip_health:
            return DripResponse()
        root = self._state.profile.served_root
        data = [
            {"id": model_id, "object": "model", "created": self._created, "owned_by": "sim"}
            | ({"root": root} if root is not None else {})
            for model_id in self._state.profile.model_ids
        ]
        return json_response({"object": "list", "data": data})

    async def health(self, request: Request) -> Response | StallResponse | DripResponse:
        self._state.counters.health_checks += 1
        faults = self._state.faults
        if faults.status is not None and faults.status >= 500:
            return fault_status_response(faults)
        if faults.stall_after is not None:
            return StallResponse()
        if faults.drip_health:
            return DripResponse()
        return json_response({"status": "ok"})

    async def control(self, request: Request) -> Response:
        return json_response(self._state.snapshot())

    async def put_faults(self, request: Request) -> Response:
        try:
            fields = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return error_response(400, "request body is not valid JSON")
        if not isinstance(fields, dict):
            return error_response(400, "faults must be a JSON object of Faults fields")
        try:
            self._state.faults = faults_from_mapping(fields)
        except FaultError as exc:
            return error_response(400, str(exc))
        return json_response({"faults": self._state.faults.as_dict()})

    async def reset(self, request: Request) -> Response:
        self._state.reset()
        return json_response(self._state.snapshot())
