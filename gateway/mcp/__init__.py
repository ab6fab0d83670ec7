"""MCP: the gateway as an MCP server for agents, in front of the MCP servers that run the tools.

`upstream.py` supervises one connection per upstream server, `service.py` judges, holds, forwards
and audits each call, `endpoint.py` is the authenticated Streamable HTTP endpoint. The `mcp` SDK is
imported only below this package, and only when `mcp.servers` is configured.
"""
