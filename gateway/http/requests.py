"""Reading a request's body at the edge, and the stage that turns it into the kernel's request.

Which surface's request it is, the stage does not know: `ctx.surface` parses and validates it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from starlette.requests import Request

from gateway.core.chunks import Chunk
from gateway.deadlines import deadline_in
from gateway.errors import BodyTooLarge, RequestTimeout
from gateway.pipeline import Handler, RequestContext
from gateway.settings import Operation


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The raw body, refusing to buffer more than `limit` bytes or to wait more than `timeout_s`
    for it (a slow client would otherwise hold its audit slot and connection for good)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"Request body is {declared} bytes; the limit is {limit} bytes")
    body = bytearray()
    try:
        with deadline_in(timeout_s):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise BodyTooLarge(f"Request body exceeds the limit of {limit} bytes")
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {timeout_s:g}s") from None
    return bytes(body)


class ParseRequest:
    """The pipeline stage that reads and validates the body, after authentication and before
    anything is counted against a quota.

    A large body is decoded and validated in a worker thread, so one 10 MB request does not stall
    every other request on this replica for the time that takes.
    """

    def __init__(self, max_json_depth: int, parse_in_thread_bytes: int) -> None:
        self._max_json_depth = max_json_depth
        self._parse_in_thread_bytes = parse_in_thread_bytes

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        assert ctx.read_body is not None
        body = await ctx.read_body()
        parse = ctx.surface.parse
        if len(body) > self._parse_in_thread_bytes:
            parsed = await asyncio.to_thread(parse, body, self._max_json_depth)
        else:
            parsed = parse(body, self._max_json_depth)
        ctx.body = parsed.body
        ctx.model = parsed.model
        ctx.stream = parsed.stream
        ctx.include_usage = parsed.include_usage
        ctx.echo = parsed.echo
        ctx.continuity = parsed.continuity
        ctx.operation = Operation(parsed.operation)
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk
