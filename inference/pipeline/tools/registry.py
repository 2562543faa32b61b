"""The tool-parser registry (names: see each family's module)."""

from __future__ import annotations

from inference.pipeline.registry import ParserRegistry
from inference.pipeline.tools.base import ToolParser

__all__ = ["TOOL_PARSERS"]

TOOL_PARSERS: ParserRegistry[ToolParser] = ParserRegistry("tool parser")
