"""Plain JSON (``json``): the whole output is one call object or an array of them, with ``name``
and ``parameters`` or ``arguments``, as models constrained to a JSON schema for a required or
named tool_choice answer::

    [{"name": "get_weather", "parameters": {"city": "Paris"}}]

Anything else is content. Decided at the end of the output. ``passthrough`` parses nothing.
"""

from __future__ import annotations

import json

from inference.pipeline.tools.base import RegionResult, ToolParser, call_from_object
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["JsonToolParser", "PassthroughToolParser"]


@TOOL_PARSERS.register("json")
class JsonToolParser(ToolParser):
    def _opens_at_start(self, text: str) -> bool | None:
        return text.startswith(("{", "["))

    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        if not final:
            return None
        try:
            value = json.loads(region)
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return RegionResult(len(region), None)
        items = value if isinstance(value, list) else [value]
        calls = tuple(call_from_object(item) for item in items)
        if not calls or any(call is None for call in calls):
            return RegionResult(len(region), None)
        return RegionResult(len(region), tuple(call for call in calls if call is not None))


@TOOL_PARSERS.register("passthrough")
class PassthroughToolParser(ToolParser):
    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        return RegionResult(len(region), None)
