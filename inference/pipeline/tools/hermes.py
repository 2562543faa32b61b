"""JSON in tags (Qwen 2.5 / Qwen3, Hermes, and every template that copied them)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One call per tag pair; several pairs for parallel calls. ``parameters`` is accepted for
``arguments``, and string-encoded arguments are decoded.
"""

from __future__ import annotations

import json

from inference.pipeline.tools.base import RegionResult, ToolParser, call_from_object, closed_region
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["HermesToolParser"]

START, END = "<tool_call>", "</tool_call>"


@TOOL_PARSERS.register("qwen", "qwen25", "hermes")
class HermesToolParser(ToolParser):
    start_markers = (START,)

    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        closed = closed_region(region, START, END, final)
        if closed is None:
            return None
        if closed is False or closed is True:
            return RegionResult(len(region), None)
        body, consumed = closed
        try:
            call = call_from_object(json.loads(body))
        except ValueError:
            call = None
        return RegionResult(consumed, (call,) if call else None)
