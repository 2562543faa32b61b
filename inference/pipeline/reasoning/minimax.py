"""MiniMax M2 (profile B): the template opens ``<think>`` in the generation prompt, so the output
starts inside the block (the reference gateway's "append think" parser, separated)."""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.reasoning.registry import REASONING_PARSERS

__all__ = ["MiniMaxReasoningParser"]


@REASONING_PARSERS.register("minimax", "minimax_m2")
class MiniMaxReasoningParser(ReasoningParser):
    starts_in_reasoning = True
