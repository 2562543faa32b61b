"""The MCP servers of one Responses request (spec 2, Tools: mcp and the MCP-backed built-ins): which
servers, their tools as the model sees them, and running the calls the model makes.

Servers come from ``mcp`` tools (``server_url``, or ``connector_id`` naming a server of
--mcp-config-path) and from the built-in tool types the operator backs with a configured server.
Every session goes through the SSRF guard (:mod:`inference.mcp`); a server that cannot be reached
or listed answers 424 ``connect_mcp_server_failed``. Sessions are short: one to list the tools
before the first model turn, one per server for each batch of calls, each closed when done, so no
session outlives the work that needs it whatever happens to the request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Mapping

from common.config import current_config
from common.mcp_metrics import record_mcp_tool_call
from inference.errors import GatewayError
from inference.mcp import McpConnectError, McpServerParams, McpServerParamsError, McpTool, mcp_config_of, mcp_connector
from responses_api.request import MCP_BUILTINS

__all__ = ["McpServers", "McpCallResult"]


@dataclass(frozen=True, slots=True)
class McpCallResult:
    output: str
    error: str | None = None


@dataclass
class _Server:
    params: McpServerParams
    allowed: frozenset[str] | None
    tools: tuple[McpTool, ...] = ()


def _connect_error(error: Exception) -> GatewayError:
    message = getattr(error, "message", None) or str(error)
    return GatewayError(424, "connect_mcp_server_failed", f"Failed to connect to MCP server: {message}")


def _allowed(tool: Mapping[str, Any]) -> frozenset[str] | None:
    allowed = tool.get("allowed_tools")
    if allowed is None:
        return None
    names = allowed.get("tool_names") if isinstance(allowed, Mapping) else allowed
    return frozenset(names or ())


@dataclass
class McpServers:
    servers: dict[str, _Server] = field(default_factory=dict)  # by server label

    @classmethod
    def of_request(cls, tools: list[Mapping[str, Any]]) -> McpServers:
        """The request's MCP servers (none when it declares no mcp or MCP-backed built-in tool)."""
        found = cls()
        if not any(tool.get("type") == "mcp" or tool.get("type") in MCP_BUILTINS for tool in tools):
            return found
        config = mcp_config_of(current_config())
        for tool in tools:
            kind = tool.get("type")
            try:
                if kind == "mcp":
                    label = str(tool["server_label"])
                    if tool.get("connector_id") is not None:
                        spec = config.server(str(tool["connector_id"]))
                        if spec is None:
                            raise GatewayError(
                                424, "connect_mcp_server_failed", f"No MCP server is configured as {tool['connector_id']!r}"
                            )
                        params = spec.params
                    else:
                        given = tool.get("headers")
                        headers: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
                        params = McpServerParams(
                            label, str(tool["server_url"]), authorization=tool.get("authorization"),
                            headers=tuple((str(k), str(v)) for k, v in headers.items()),
                        )  # fmt: skip
                    found.servers[label] = _Server(params, _allowed(tool))
                elif kind in MCP_BUILTINS:
                    spec = config.for_builtin(str(kind))
                    if spec is None:
                        raise GatewayError(400, "tool_not_supported", f"No MCP server backs the {kind} tool here")
                    found.servers[spec.name] = _Server(spec.params, None)
            except McpServerParamsError as error:
                raise GatewayError(400, 400, str(error), param="tools") from None
        return found

    def __bool__(self) -> bool:
        return bool(self.servers)

    async def list_tools(self) -> None:
        """Connect to every server at once and keep the tools each lists (and allows)."""
        connector = mcp_connector(current_config())

        async def one(server: _Server) -> None:
            async with connector.session(server.params) as session:
                tools = await session.list_tools()
            server.tools = tuple(tool for tool in tools if server.allowed is None or tool.name in server.allowed)

        try:
            await asyncio.gather(*(one(server) for server in self.servers.values()))
        except McpConnectError as error:
            raise _connect_error(error) from None

    def listings(self) -> list[tuple[str, list[dict[str, Any]]]]:
        return [(label, [tool.as_item() for tool in server.tools]) for label, server in self.servers.items()]

    def tool_labels(self) -> dict[str, str]:
        """Tool name → server label (the first server listing a name owns it)."""
        labels: dict[str, str] = {}
        for label, server in self.servers.items():
            for tool in server.tools:
                labels.setdefault(tool.name, label)
        return labels

    def _functions(self) -> list[dict[str, Any]]:
        """Each tool the model may call as a function: name, description, parameters."""
        found = []
        for name, label in self.tool_labels().items():
            tool = next(t for t in self.servers[label].tools if t.name == name)
            function: dict[str, Any] = {"name": name, "parameters": tool.input_schema or {"type": "object", "properties": {}}}
            if tool.description:
                function["description"] = tool.description
            found.append(function)
        return found

    def chat_tools(self) -> list[dict[str, Any]]:
        """The tools as chat tools (the gateway's chat pipeline)."""
        return [{"type": "function", "function": function} for function in self._functions()]

    def function_tools(self) -> list[dict[str, Any]]:
        """The tools as Responses function tools (an external provider's /v1/responses)."""
        return [{"type": "function", **function, "strict": False} for function in self._functions()]

    async def run(self, calls: list[dict[str, Any]], model: str | None = None) -> list[McpCallResult]:
        """Run ``calls`` (``name``, ``arguments`` JSON text, ``server_label``): one session per server,
        servers at once, calls of one server in order. A failure is a result, never an exception.
        Each call is counted for ``model`` (:mod:`common.mcp_metrics`)."""
        connector = mcp_connector(current_config())
        results: list[McpCallResult | None] = [None] * len(calls)
        by_server: dict[str, list[int]] = {}
        for position, call in enumerate(calls):
            by_server.setdefault(call["server_label"], []).append(position)

        async def one(label: str, positions: list[int]) -> None:
            try:
                async with connector.session(self.servers[label].params) as session:
                    for position in positions:
                        call = calls[position]
                        try:
                            arguments = json.loads(call["arguments"] or "{}")
                        except ValueError:
                            results[position] = McpCallResult("", "the tool arguments are not valid JSON")
                            record_mcp_tool_call(model, call["name"], True, None)
                            continue
                        began = perf_counter()
                        result = await session.call_tool(call["name"], arguments if isinstance(arguments, dict) else {})
                        record_mcp_tool_call(model, call["name"], result.is_error, perf_counter() - began)
                        results[position] = McpCallResult(result.output, result.output if result.is_error else None)
            except McpConnectError as error:
                for position in positions:
                    if results[position] is None:
                        results[position] = McpCallResult("", f"MCP server unavailable: {error.message}")
                        record_mcp_tool_call(model, calls[position]["name"], True, None)

        await asyncio.gather(*(one(label, positions) for label, positions in by_server.items()))
        return [result or McpCallResult("", "not run") for result in results]
