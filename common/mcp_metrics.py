"""The MCP tool metrics of the catalog (spec 3), in the gateway's metrics registry
(:mod:`common.telemetry`), recorded by the gateway's MCP tool loops: the Messages loop
(:mod:`inference.mcp.toolsets`) and the Responses API's (:mod:`responses_api.mcp_tools`).

- ``gw_mcp_tool_calls_total{model, tool_name, result}``: each tool call the model asked for and the
  gateway ran, ``success`` when the server's result is not an error, ``error`` otherwise: the tool's
  own error (``isError``), a protocol error, a timeout, an oversized or lost answer, arguments that
  are not a JSON object's text (Responses), or a server the gateway could not reach;
- ``gw_mcp_tool_duration_seconds{model, tool_name}``: the time of each call sent to a server
  (``tools/call`` sent to its result or failure), on the gateway's duration buckets; calls that
  never reached a server (unreachable, arguments refused) have no duration.

``model`` is bounded as everywhere (:func:`common.telemetry.bounded_model`); ``tool_name`` likewise
keeps the first 1,024 distinct names, later new names report as ``other`` (spec 3's cardinality
bounds).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# The gateway's one memo of labelled children (telemetry's: .labels() validates and locks on every call).
from common.telemetry import DEFAULT_DURATION_BUCKETS, OTHER, REGISTRY, _child, bounded_model

__all__ = ["MCP_TOOL_CALLS", "MCP_TOOL_DURATION", "bounded_tool", "record_mcp_tool_call"]

_MAX_TOOLS = 1024

MCP_TOOL_CALLS = Counter("gw_mcp_tool_calls_total", "MCP tool calls the gateway ran, by result",
                         ("model", "tool_name", "result"), registry=REGISTRY)  # fmt: skip
MCP_TOOL_DURATION = Histogram("gw_mcp_tool_duration_seconds", "Duration of MCP tool calls sent to a server",
                              ("model", "tool_name"), buckets=DEFAULT_DURATION_BUCKETS, registry=REGISTRY)  # fmt: skip

_tools: set[str] = set()


def bounded_tool(name: str) -> str:
    """The tool_name label: the first 1,024 distinct names, then ``other``."""
    if name in _tools:
        return name
    if len(_tools) >= _MAX_TOOLS:
        return OTHER
    _tools.add(name)
    return name


def record_mcp_tool_call(model: str | None, tool: str, failed: bool, seconds: float | None) -> None:
    """One MCP tool call of ``model``'s: its result, and its duration when it reached a server."""
    model_label = bounded_model(model)
    tool_label = bounded_tool(tool)
    _child(MCP_TOOL_CALLS, model_label, tool_label, "error" if failed else "success").inc()
    if seconds is not None:
        _child(MCP_TOOL_DURATION, model_label, tool_label).observe(seconds)
