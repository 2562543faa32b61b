"""Qwen3 (hybrid and thinking models) and QwQ: ``<think>…</think>``.

The reference gateway's rule (docs ENGINES.md): an output without ``<think>`` is reasoning unless
thinking is off, and thinking off is seen in the prompt, whose template then closes an empty block
(``<think>\\n\\n</think>\\n\\n``): build the parser with :meth:`ReasoningParser.for_prompt`.
"""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.reasoning.registry import REASONING_PARSERS

__all__ = ["Qwen3ReasoningParser"]


@REASONING_PARSERS.register("qwen3", "qwen3_thinking", "qwq")
class Qwen3ReasoningParser(ReasoningParser):
    starts_in_reasoning = True
