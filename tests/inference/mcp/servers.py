"""A real MCP server for the client's tests: the ``mcp`` SDK's MCPServer (FastMCP) served over
Streamable HTTP by uvicorn in a thread on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import uvicorn
from mcp_types import ToolAnnotations
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["build_server", "serving"]


def build_server(extra_tools: int = 0) -> MCPServer:
    server = MCPServer("test-tools")

    @server.tool(description="Echo the text back.", annotations=ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        return f"echo: {text}"

    @server.tool(description="Always fails.")
    def fail(reason: str = "no luck") -> str:
        raise ToolError(f"failed: {reason}")

    @server.tool(description="Sleeps, then answers.")
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    @server.tool(description="Returns n bytes of text.")
    def big(n: int) -> str:
        return "x" * n

    @server.tool(description="The request headers the server saw.")
    def whoami(ctx: Context) -> str:
        headers = ctx.headers or {}
        return f"{headers.get('authorization')}|{headers.get('x-team')}"

    for index in range(extra_tools):
        server.add_tool(lambda: "ok", name=f"extra_{index}", description="filler")
    return server


@contextmanager
def serving(server: MCPServer, *, json_response: bool = False) -> Iterator[str]:
    """Serve ``server`` on 127.0.0.1; yields the endpoint URL (``http://127.0.0.1:PORT/mcp``).
    ``json_response``: answer requests with JSON bodies instead of SSE streams."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = server.streamable_http_app(json_response=json_response)
    instance = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio"))
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not instance.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the MCP test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        instance.should_exit = True
        thread.join(timeout=10)
        sock.close()
