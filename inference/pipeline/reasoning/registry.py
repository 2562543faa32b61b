"""The reasoning-parser registry (names: see each family's module)."""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.registry import ParserRegistry

__all__ = ["REASONING_PARSERS"]

REASONING_PARSERS: ParserRegistry[ReasoningParser] = ParserRegistry("reasoning parser")
