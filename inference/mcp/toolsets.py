"""The MCP servers and toolsets of one Messages request whose tool loop the gateway runs (spec 1,
"Messages-style API": MCP tool loop): read from ``mcp_servers`` and the ``mcp_toolset`` tools,
connected through the one MCP client (:mod:`inference.mcp.client`: the SSRF guard and the per-server
limits), their enabled tools offered to the model as custom tools, and the calls the model makes run.

- ``mcp_servers[]``: ``name``, ``url`` (http or https, Streamable HTTP), ``authorization_token``
  (sent as a Bearer token). A URL containing ``/sse`` names the legacy SSE transport, which the
  gateway cannot connect to: that server counts as one that did not connect.
- ``mcp_toolset``: ``mcp_server_name`` (one of ``mcp_servers``), ``default_config`` (``enabled``,
  default true; ``defer_loading``), ``configs`` keyed by tool name. With ``configs`` only the tools it
  lists are exposed, those whose ``enabled`` is true or, unset, falls back to the default's; without
  it every tool the server lists is, when the default is enabled. ``defer_loading`` (the tool's own,
  else the default's) is copied to the tool the model gets.
- Only the servers a toolset names are connected, all at once. Those that do not connect are left
  out; when none does the request fails (502 ``mcp_connection_failed``). A tool whose name an earlier
  toolset or one of the client's own tools already has is left out (the model's call of that name
  is the other's).
- Sessions are short, as in the Responses API's loop: one per server to list its tools, one per
  server for each round of calls, each closed when done.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Mapping

from common.config import current_config
from common.mcp_metrics import record_mcp_tool_call
from inference import errors
from inference.mcp.client import McpServerParams, McpTool, McpToolResult, mcp_connector, safe_url
from inference.mcp.errors import McpConnectError, McpServerParamsError

__all__ = ["ExposedTool", "McpToolsets", "SSE_MARK"]

log = logging.getLogger("inference.mcp")

SSE_MARK = "/sse"
"""What in a server URL selects the legacy SSE transport (the gateway speaks Streamable HTTP only)."""


@dataclass(frozen=True, slots=True)
class ExposedTool:
    """One MCP tool as the model is offered it, and the server that runs it."""

    server: str
    tool: McpTool
    defer_loading: bool | None

    def as_custom_tool(self) -> dict[str, Any]:
        given: dict[str, Any] = {
            "name": self.tool.name, "input_schema": self.tool.input_schema or {"type": "object", "properties": {}},
        }  # fmt: skip
        if self.tool.description:
            given["description"] = self.tool.description
        if self.defer_loading is not None:
            given["defer_loading"] = self.defer_loading
        return given


@dataclass(frozen=True, slots=True)
class _Toolset:
    server: str
    enabled: bool  # default_config.enabled
    defer_loading: bool | None  # default_config.defer_loading
    configs: Mapping[str, Mapping[str, Any]] | None

    def exposure(self, name: str) -> tuple[bool, bool | None]:
        """Whether tool ``name`` is exposed, and its defer_loading."""
        if self.configs is None:
            return self.enabled, self.defer_loading
        config = self.configs.get(name)
        if config is None:
            return False, None
        enabled = config.get("enabled")
        defer = config.get("defer_loading")
        return (self.enabled if enabled is None else enabled), (self.defer_loading if defer is None else defer)


@dataclass
class McpToolsets:
    """The request's MCP servers and toolsets (see the module's docstring)."""

    servers: dict[str, McpServerParams]
    toolsets: tuple[_Toolset, ...]
    reserved: frozenset[str]  # the client's own tool names
    exposed: dict[str, ExposedTool] = field(default_factory=dict)  # by tool name, once connected

    @classmethod
    def of_request(cls, body: Mapping[str, Any]) -> McpToolsets:
        """Read ``mcp_servers`` and the ``mcp_toolset`` tools. Raises GatewayError 400 for a field
        of the wrong shape, a server named twice, or a toolset naming no server of the request."""
        servers: dict[str, McpServerParams] = {}
        for i, entry in enumerate(body.get("mcp_servers") or ()):
            where = f"mcp_servers[{i}]"
            if not isinstance(entry, dict):
                raise errors.invalid_request(f"{where} must be an object", where)
            name, url, token = entry.get("name"), entry.get("url"), entry.get("authorization_token")
            if entry.get("type", "url") != "url":
                raise errors.invalid_request(f'{where}.type must be "url"', f"{where}.type")
            if not isinstance(name, str) or not name:
                raise errors.invalid_request(f"{where}.name must be a non-empty string", f"{where}.name")
            if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
                raise errors.invalid_request(f"{where}.url must be an http:// or https:// URL", f"{where}.url")
            if token is not None and not isinstance(token, str):
                raise errors.invalid_request(f"{where}.authorization_token must be a string", f"{where}.authorization_token")
            if name in servers:
                raise errors.invalid_request(f"{where}.name: MCP server {name!r} is given twice", f"{where}.name")
            try:
                servers[name] = McpServerParams(name, url, authorization=token or None)
            except McpServerParamsError as error:
                raise errors.invalid_request(f"{where}: {error}", where) from None
        toolsets: list[_Toolset] = []
        reserved: set[str] = set()
        for i, tool in enumerate(body.get("tools") or ()):
            if tool.get("type") != "mcp_toolset":
                if isinstance(tool.get("name"), str):
                    reserved.add(tool["name"])
                continue
            toolsets.append(_toolset(tool, f"tools[{i}]", servers))
        return cls(servers, tuple(toolsets), frozenset(reserved))

    async def connect(self) -> None:
        """List the tools of every server a toolset names, at once, and expose the enabled ones.
        Raises GatewayError 502 mcp_connection_failed when none connects."""
        wanted = dict.fromkeys(toolset.server for toolset in self.toolsets)
        connector = mcp_connector(current_config())
        listed: dict[str, tuple[McpTool, ...]] = {}
        failures: list[str] = []

        async def one(name: str) -> None:
            params = self.servers[name]
            if SSE_MARK in params.url:
                failures.append(
                    f"MCP server {name!r} at {safe_url(params.url)}: the URL selects the legacy SSE transport, "
                    "which the gateway cannot connect to (give the server's Streamable HTTP endpoint)"
                )
                return
            try:
                async with connector.session(params) as session:
                    listed[name] = await session.list_tools()
            except McpConnectError as error:
                log.info("MCP server %r left out of the tool loop: %s", name, error.reason)
                failures.append(error.message)

        await asyncio.gather(*(one(name) for name in wanted))
        if not listed:
            raise errors.mcp_connection_failed("; ".join(failures) or "no MCP server was named")
        for toolset in self.toolsets:
            for tool in listed.get(toolset.server, ()):
                enabled, defer = toolset.exposure(tool.name)
                if enabled and tool.name not in self.exposed and tool.name not in self.reserved:
                    self.exposed[tool.name] = ExposedTool(toolset.server, tool, defer)

    def custom_tools(self) -> list[dict[str, Any]]:
        return [tool.as_custom_tool() for tool in self.exposed.values()]

    async def run(self, calls: list[tuple[str, dict[str, Any]]], model: str | None = None) -> list[McpToolResult]:
        """Run ``calls`` (exposed tool name, input): one session per server, servers at once, the
        calls of one server in order. A failure is a result with ``is_error`` set, never an exception.
        Each call is counted for ``model`` (:mod:`common.mcp_metrics`)."""
        connector = mcp_connector(current_config())
        results: list[McpToolResult | None] = [None] * len(calls)
        by_server: dict[str, list[int]] = {}
        for position, (name, _input) in enumerate(calls):
            by_server.setdefault(self.exposed[name].server, []).append(position)

        async def one(server: str, positions: list[int]) -> None:
            try:
                async with connector.session(self.servers[server]) as session:
                    for position in positions:
                        name, given = calls[position]
                        began = perf_counter()
                        result = results[position] = await session.call_tool(name, given)
                        record_mcp_tool_call(model, name, result.is_error, perf_counter() - began)
            except McpConnectError as error:
                for position in positions:
                    if results[position] is None:
                        results[position] = McpToolResult(f"MCP server unavailable: {error.message}", is_error=True,
                                                          error_kind="connection")  # fmt: skip
                        record_mcp_tool_call(model, calls[position][0], True, None)

        await asyncio.gather(*(one(server, positions) for server, positions in by_server.items()))
        return [result or McpToolResult("not run", is_error=True) for result in results]


def _flag(value: Any, param: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise errors.invalid_request(f"{param} must be a boolean", param)
    return value


def _toolset(tool: Mapping[str, Any], where: str, servers: Mapping[str, McpServerParams]) -> _Toolset:
    server = tool.get("mcp_server_name")
    if not isinstance(server, str) or server not in servers:
        raise errors.invalid_request(
            f"{where}.mcp_server_name must name one of mcp_servers (got {server!r})", f"{where}.mcp_server_name"
        )
    default = tool.get("default_config") or {}
    if not isinstance(default, dict):
        raise errors.invalid_request(f"{where}.default_config must be an object", f"{where}.default_config")
    enabled = _flag(default.get("enabled"), f"{where}.default_config.enabled")
    defer = _flag(default.get("defer_loading"), f"{where}.default_config.defer_loading")
    configs = tool.get("configs")
    if configs is not None:
        if not isinstance(configs, dict) or not all(isinstance(c, dict) for c in configs.values()):
            raise errors.invalid_request(f"{where}.configs must be an object of objects", f"{where}.configs")
        for name, config in configs.items():
            _flag(config.get("enabled"), f"{where}.configs.{name}.enabled")
            _flag(config.get("defer_loading"), f"{where}.configs.{name}.defer_loading")
    return _Toolset(server, True if enabled is None else enabled, defer, configs)
