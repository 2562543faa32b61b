"""Llama 3.x JSON tool calls: an object with ``name`` and ``parameters`` (``arguments`` also
accepted), either after ``<|python_tag|>`` (a special token: decode with special tokens kept) or
as the bare output::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}
    {"name": "get_weather", "parameters": {"city": "Paris"}}

Several calls are separated by ``;``. A bare object counts only at the start of the output. There
is no closing marker (``<|eom_id|>``/``<|eot_id|>`` end generation), so the calls are decided at the
end of the output; text after the last call stays content. Llama 3.1's built-in tools
(``<|python_tag|>brave_search.call(...)``) are not JSON and stay content.
"""

from __future__ import annotations

import json

from inference.pipeline.tools.base import ParsedCall, RegionResult, ToolParser, call_from_object
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["LlamaToolParser"]

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_KEYS = ("parameters", "arguments")


@TOOL_PARSERS.register("llama", "llama3", "llama3_json", "llama4_json")
class LlamaToolParser(ToolParser):
    start_markers = (PYTHON_TAG,)
    special_markers = (PYTHON_TAG,)

    def _opens_at_start(self, text: str) -> bool | None:
        return text.startswith("{")

    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        if not final:
            return None
        at = len(PYTHON_TAG) if region.startswith(PYTHON_TAG) else 0
        calls: list[ParsedCall] = []
        consumed = at
        while True:
            while at < len(region) and region[at].isspace():
                at += 1
            if calls and region.startswith(";", at):
                at += 1
                while at < len(region) and region[at].isspace():
                    at += 1
            if at >= len(region):
                break
            try:
                value, end = _DECODER.raw_decode(region, at)
            except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
                break
            call = call_from_object(value, keys=_KEYS)
            if call is None:
                break
            calls.append(call)
            at = consumed = end
        if not calls:
            return RegionResult(len(region), None)
        return RegionResult(consumed, tuple(calls))
