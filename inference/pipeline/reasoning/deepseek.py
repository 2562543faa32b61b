"""DeepSeek: R1 (the template opens ``<think>\\n`` in the generation prompt, so the output starts
inside the block, and R1-0528 may repeat the marker) and V3.1 / V3.2 / V4 (the prompt ends with
``<think>`` when thinking is on and ``</think>`` when off: build with
:meth:`ReasoningParser.for_prompt`; with neither, no reasoning is assumed)."""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.reasoning.registry import REASONING_PARSERS

__all__ = ["DeepSeekR1ReasoningParser", "DeepSeekV3ReasoningParser"]


@REASONING_PARSERS.register("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    starts_in_reasoning = True


@REASONING_PARSERS.register("deepseek_v3", "deepseek_v31", "deepseek31", "deepseek_v4")
class DeepSeekV3ReasoningParser(ReasoningParser):
    starts_in_reasoning = False
