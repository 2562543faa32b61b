"""Step-3: ``<think>…</think>`` with the block opened by the prompt, as DeepSeek R1."""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.reasoning.registry import REASONING_PARSERS

__all__ = ["Step3ReasoningParser"]


@REASONING_PARSERS.register("step3")
class Step3ReasoningParser(ReasoningParser):
    starts_in_reasoning = True
