"""MCP (Model Context Protocol) for the tool loops of the Responses and Messages APIs: the client
(:mod:`inference.mcp.client`, the ``mcp`` SDK over Streamable HTTP through the SSRF guard in
:mod:`common.ssrf` / :mod:`common.ssrf_http`), the servers behind the built-in tools
(:mod:`inference.mcp.config`, ``--mcp-config-path``) and the typed failures
(:mod:`inference.mcp.errors`). The loops themselves come next to these modules."""

from inference.mcp.client import (
    McpConnector,
    McpLimits,
    McpServerParams,
    McpSession,
    McpTool,
    McpToolResult,
    mcp_connector,
    safe_url,
)
from inference.mcp.config import BUILTIN_TOOL_TYPES, McpConfig, McpServerSpec, load_mcp_config, mcp_config_of, parse_mcp_config
from inference.mcp.errors import McpConfigError, McpConnectError, McpError, McpListToolsError, McpServerParamsError

__all__ = [
    "BUILTIN_TOOL_TYPES",
    "McpConfig",
    "McpConfigError",
    "McpConnectError",
    "McpConnector",
    "McpError",
    "McpLimits",
    "McpListToolsError",
    "McpServerParams",
    "McpServerParamsError",
    "McpServerSpec",
    "McpSession",
    "McpTool",
    "McpToolResult",
    "load_mcp_config",
    "mcp_config_of",
    "mcp_connector",
    "parse_mcp_config",
    "safe_url",
]
