"""A reference OpenAI-compatible server over a tiny torch checkpoint (tests only).

    python -m tests.support.refserver --checkpoint DIR --port 0

Loads a torch.distributed.checkpoint (DCP) directory of a `charlm.CharLM` and serves
POST /v1/chat/completions (streamed or not), GET /v1/models and GET /health. The prompt is the
system message's content followed by the last user message; generation is greedy, so one
checkpoint always answers one prompt the same way. Streams send one character per chunk,
`--char-delay-ms` apart, so a test can act while a stream is in flight. Prints
`refserver listening on http://HOST:PORT/v1` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# dcp.load, from the module that defines it: the package's re-export is not explicit enough for mypy.
from torch.distributed.checkpoint.state_dict_loader import load as load_dcp

from tests.support import charlm

MODEL_ID = "tiny"


def load_checkpoint(directory: Path) -> charlm.CharLM:
    model = charlm.CharLM()
    state = model.state_dict()
    # Without an initialized process group DCP warns that it assumes a single process: it is one.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
    load_dcp(state, checkpoint_id=str(directory))  # in place, into the fresh model's tensors
    model.load_state_dict(state)
    model.eval()
    return model


def prompt_of(messages: list[dict[str, Any]]) -> str:
    """The system message's content + the last user message's content."""

    def text(message: dict[str, Any]) -> str:
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return str(content)

    system = "".join(text(m) for m in messages if m.get("role") == "system")
    users = [text(m) for m in messages if m.get("role") == "user"]
    return system + (users[-1] if users else "")


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def create_app(model: charlm.CharLM, char_delay_s: float) -> Starlette:
    lock = asyncio.Lock()  # one forward pass at a time; the model is tiny

    async def step(ids: list[int]) -> int:
        async with lock:
            return charlm.next_char(model, ids)

    async def chat(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
            messages = body["messages"]
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return _json({"error": {"message": "bad request", "type": "invalid_request_error"}}, 400)
        prompt = prompt_of(messages)
        ids = charlm.encode(prompt)
        rid = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        created = int(time.time())

        def envelope(kind: str, **fields: Any) -> dict[str, Any]:
            return {"id": rid, "object": kind, "created": created, "model": MODEL_ID, **fields}

        usage = {"prompt_tokens": len(ids), "completion_tokens": max_tokens, "total_tokens": len(ids) + max_tokens}
        if not body.get("stream"):
            out: list[int] = []
            for _ in range(max_tokens):
                out.append(await step(ids + out))
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": charlm.decode(out)},
                "finish_reason": "length",
            }
            return _json(envelope("chat.completion", choices=[choice], usage=usage))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return _sse(envelope("chat.completion.chunk", choices=[choice]))

        async def events() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})
            out: list[int] = []
            for _ in range(max_tokens):
                out.append(await step(ids + out))
                yield chunk({"content": charlm.VOCAB[out[-1]]})
                await asyncio.sleep(char_delay_s)
            yield chunk({}, "length")
            if include_usage:
                yield _sse(envelope("chat.completion.chunk", choices=[], usage=usage))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(_: Request) -> Response:
        return _json({"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "tests"}]})

    async def health(_: Request) -> Response:
        return _json({"status": "ok"})

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)


class _AnnouncingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            print(f"refserver listening on {self._url}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a DCP checkpoint directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--char-delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_checkpoint(args.checkpoint)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        create_app(model, args.char_delay_ms / 1000),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = _AnnouncingServer(config, f"http://{host}:{port}/v1")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


if __name__ == "__main__":
    main()
