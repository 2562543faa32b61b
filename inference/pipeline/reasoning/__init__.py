"""Reasoning parsers, one module per family, registered by name in :data:`REASONING_PARSERS`.

Importing this package registers every family. Resolve a name with
``REASONING_PARSERS.get(name)`` (raises :class:`~inference.pipeline.registry.UnknownParser`).
"""

from __future__ import annotations

from inference.pipeline.reasoning import deepseek, glm45, kimi, minimax, mistral, qwen3, step3
from inference.pipeline.reasoning.base import ParsedReasoning, ReasoningParser, prompt_reasoning_state
from inference.pipeline.reasoning.registry import REASONING_PARSERS
from inference.pipeline.reasoning.token_count import ReasoningTokenCount

__all__ = [
    "REASONING_PARSERS", "ParsedReasoning", "ReasoningParser", "ReasoningTokenCount", "prompt_reasoning_state",
    "deepseek", "glm45", "kimi", "minimax", "mistral", "qwen3", "step3",
]  # fmt: skip
