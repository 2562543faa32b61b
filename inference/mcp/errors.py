"""The MCP client's typed failures. The tool loops turn them into their surface's errors:

==========================  ===============================================  =====================================
exception                   Responses API                                    Messages API (X-GW-MCP loop)
==========================  ===============================================  =====================================
McpConnectError             424 ``connect_mcp_server_failed``                502 ``mcp_connection_failed`` (when
(and McpListToolsError)                                                      no server connects)
McpServerParamsError        400 ``invalid_request_error``                    400 ``invalid_request_error``
McpConfigError              start-up stops (``--mcp-config-path``)           same
==========================  ===============================================  =====================================

A failed *tool call* is not an exception: :meth:`McpSession.call_tool` returns a result with
``is_error`` set, which the loops hand back to the model (spec 2: a failed MCP call does not fail
the response).
"""

from __future__ import annotations

from common.ssrf import SsrfRefused

__all__ = ["McpError", "McpConnectError", "McpListToolsError", "McpServerParamsError", "McpConfigError"]


class McpError(Exception):
    """Base of the MCP client's exceptions."""


class McpConnectError(McpError):
    """An MCP server could not be used: refused by the SSRF guard, unreachable, timed out, not
    speaking MCP, or too many sessions open. ``message`` is safe to show the client (it names the
    server label and its URL without credentials or query); ``refused`` carries the guard's
    refusal when that was the cause."""

    responses_status = 424
    responses_code = "connect_mcp_server_failed"
    messages_status = 502
    messages_code = "mcp_connection_failed"

    def __init__(self, label: str, url: str, reason: str, *, refused: SsrfRefused | None = None) -> None:
        self.label = label
        self.url = url
        self.reason = reason
        self.refused = refused
        self.message = f"cannot connect to MCP server {label!r} at {url}: {reason}"
        super().__init__(self.message)


class McpListToolsError(McpConnectError):
    """The server connected but its tool listing failed or broke a limit (counts as a connect
    failure: the server cannot be offered to the model)."""


class McpServerParamsError(McpError, ValueError):
    """The caller's server settings are unusable (a bad label, a header the gateway owns, a header
    value with a line break, too many or too long headers)."""


class McpConfigError(McpError, ValueError):
    """The ``--mcp-config-path`` file is missing, unreadable or invalid; the message names the file
    and the field."""
