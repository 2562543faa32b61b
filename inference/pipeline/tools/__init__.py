"""Tool-call parsers, one module per family, registered by name in :data:`TOOL_PARSERS`.

Importing this package registers every family. Resolve a name with ``TOOL_PARSERS.get(name)``
(raises :class:`~inference.pipeline.registry.UnknownParser`).
"""

from __future__ import annotations

from inference.pipeline.tools import deepseek, glm45, hermes, json_calls, kimik2, llama, minimax_m2, mistral, pythonic
from inference.pipeline.tools.base import ParsedCall, ParsedTools, ToolParser, ToolSchemas, make_call_id
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = [
    "TOOL_PARSERS", "ParsedCall", "ParsedTools", "ToolParser", "ToolSchemas", "make_call_id",
    "deepseek", "glm45", "hermes", "json_calls", "kimik2", "llama", "minimax_m2", "mistral", "pythonic",
]  # fmt: skip
