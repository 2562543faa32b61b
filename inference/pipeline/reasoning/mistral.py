"""Mistral's reasoning models (Magistral): ``[THINK]…[/THINK]``, opened by the model."""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.reasoning.registry import REASONING_PARSERS

__all__ = ["MistralReasoningParser"]


@REASONING_PARSERS.register("mistral", "magistral")
class MistralReasoningParser(ReasoningParser):
    start_marker = "[THINK]"
    end_marker = "[/THINK]"
