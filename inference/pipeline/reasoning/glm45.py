"""GLM 4.5 and later (profile C): the model opens ``<think>`` itself; a template with thinking
off closes an empty block in the prompt, and GLM-4.7+ templates may open it there
(:meth:`ReasoningParser.for_prompt` reads both)."""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.reasoning.registry import REASONING_PARSERS

__all__ = ["Glm45ReasoningParser"]


@REASONING_PARSERS.register("glm45", "glm47", "glm4_moe")
class Glm45ReasoningParser(ReasoningParser):
    starts_in_reasoning = False
