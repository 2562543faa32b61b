"""Kimi (profile A). ``kimi``: the Kimi-VL / k1.5 thinking markers ``◁think▷…◁/think▷``, opened
by the model. ``kimi_k2``: Kimi K2 Thinking and K2.5, ``<think>…</think>``, opened by the model
or by the prompt (:meth:`ReasoningParser.for_prompt`)."""

from __future__ import annotations

from inference.pipeline.reasoning.base import ReasoningParser
from inference.pipeline.reasoning.registry import REASONING_PARSERS

__all__ = ["KimiK2ReasoningParser", "KimiReasoningParser"]


@REASONING_PARSERS.register("kimi")
class KimiReasoningParser(ReasoningParser):
    start_marker = "\u25c1think\u25b7"
    end_marker = "\u25c1/think\u25b7"


@REASONING_PARSERS.register("kimi_k2", "kimi_k25")
class KimiK2ReasoningParser(ReasoningParser):
    starts_in_reasoning = False
