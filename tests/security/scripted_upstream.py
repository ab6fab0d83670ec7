"""An OpenAI-compatible upstream that answers with a scripted stream, for what the sim never sends
(legacy `function_call` deltas, two calls sharing one index, an error body with internal text).

The script is chosen by the last message's content, `script:<name>`; anything else gets a short
plain answer. Run as `python -m tests.security.scripted_upstream --port 0`.
"""

from __future__ import annotations

import argparse
from typing import Any

import click
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.cli.uvicorn_runner import base_url, bind, serve

LEAKED = "SECRET-upstream-detail /opt/models/internal.bin"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "up", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}


def _call(index: int, call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "function": function}
    if call_id is not None:
        call.update(id=call_id, type="function")
    return call


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "plain": [_chunk({"role": "assistant", "content": "ok"}), _chunk({}, "stop")],
    "legacy_function_call": [
        _chunk({"role": "assistant", "function_call": {"name": "delete_repo", "arguments": "{}"}}),
        _chunk({}, "function_call"),
    ],
    # Two complete calls, each allowed on its own, both numbered 0: merged by index they would be
    # one call nobody judged.
    "shared_index": [
        _chunk({"role": "assistant", "tool_calls": [_call(0, "call_a", "get_weather", '{"city":"a"}')]}),
        _chunk({"tool_calls": [_call(1, "call_x", "get_weather", '{"city":"x"}')]}),
        _chunk({"tool_calls": [_call(0, "call_b", "get_weather", '{"city":"b"}')]}),
        _chunk({}, "tool_calls"),
    ],
}


def _script(body: dict[str, Any]) -> str:
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content")
    return content.removeprefix("script:") if isinstance(content, str) and content.startswith("script:") else "plain"


async def completions(request: Request) -> Response:
    name = _script(orjson.loads(await request.body()))
    if name == "error_400":
        error = {"error": {"message": LEAKED, "type": "invalid_request_error"}}
        return Response(orjson.dumps(error), status_code=400, media_type="application/json")
    usage = {
        "id": "up",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    frames = [b"data: " + orjson.dumps(c) + b"\n\n" for c in [*SCRIPTS[name], usage]]
    return Response(b"".join(frames) + b"data: [DONE]\n\n", media_type="text/event-stream")


async def models(_: Request) -> Response:
    return Response(orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]), Route("/v1/models", models)])
    sock = bind("127.0.0.1", args.port)
    url = base_url(sock)
    serve(app, sock, lambda: click.echo(f"scripted upstream listening on {url}/v1"))


if __name__ == "__main__":
    main()
