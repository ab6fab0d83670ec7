"""An MCP tool server for the tests, written with the official SDK's server API.

    python -m testkit.mcp_upstream --http      # Streamable HTTP on a free port: prints "listening on URL"
    python -m testkit.mcp_upstream --stdio     # stdio, as the gateway's supervisor starts it

Tools as a real server would have them: `read_file` (read-only), `delete_file` (risky; the
policy restricts its path), `shutdown` (never on any whitelist). `slow_echo` takes its time, so a
test can kill the server mid-call; `big` answers with as many characters as asked for. A reply to
an approved call says whether the gateway's approval token checks out for exactly this call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from policies import InvalidApprovalToken, verify_approval_token


def build_server() -> MCPServer:
    server = MCPServer("files")

    @server.tool()
    def read_file(path: str, ctx: Context) -> str:
        """Read a text file."""
        return f"contents of {path}{_approval_note(ctx, 'read_file', {'path': path})}"

    @server.tool()
    def delete_file(path: str, ctx: Context) -> str:
        """Delete a file."""
        return f"deleted {path}{_approval_note(ctx, 'delete_file', {'path': path})}"

    @server.tool()
    def shutdown() -> str:
        """Stop the machine."""
        return "machine stopped"

    @server.tool()
    def big(size: int) -> str:
        """A result of `size` characters."""
        return "x" * min(size, 10_000_000)

    @server.tool()
    async def slow_echo(text: str, seconds: float) -> str:
        """Echo after a while."""
        await asyncio.sleep(min(seconds, 30.0))
        return f"{text} (pid {os.getpid()})"

    return server


def _approval_note(ctx: Context, tool: str, arguments: dict[str, Any]) -> str:
    """What a tool server that trusts only approved calls does: check the gateway's token against
    the call it is about to run (name as the gateway shows it, exact arguments)."""
    meta: Any = ctx.request_context.meta or {}
    approval = meta.get("agent-gateway/approval")
    if not isinstance(approval, dict):
        return ""
    secret = os.environ.get("AGW_APPROVAL_SECRET", "").encode()
    name = f"{os.environ.get('AGW_NAMESPACE', 'files')}__{tool}"
    try:
        claims = verify_approval_token(str(approval.get("token")), secret, name, json.dumps(arguments))
    except InvalidApprovalToken as error:
        return f" [approval {approval.get('id')} INVALID: {error}]"
    return f" [approval {claims.approval_id} verified]"


def main() -> None:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--http", action="store_true")
    mode.add_argument("--stdio", action="store_true")
    args = parser.parse_args()
    server = build_server()
    if args.stdio:
        server.run("stdio")
        return
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = server.streamable_http_app(stateless_http=True)
    print(f"mcp server listening on http://127.0.0.1:{port}/mcp", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
