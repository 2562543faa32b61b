"""JSON in tags (Qwen 2.5 / Qwen3, Hermes, and every template that copied them)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One call per tag pair; several pairs for parallel calls. ``parameters`` is accepted for
``arguments``, and string-encoded arguments are decoded.
"""

from __future__ import annotations

import json

from inference.pipeline.tools.base import ParsedCall, TaggedToolParser, call_from_object
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["HermesToolParser"]

START, END = "<tool_call>", "</tool_call>"


@TOOL_PARSERS.register("qwen", "qwen25", "hermes")
class HermesToolParser(TaggedToolParser):
    start_markers = (START,)
    end_marker = END

    def _calls_in(self, body: str) -> tuple[ParsedCall, ...] | None:
        try:
            call = call_from_object(json.loads(body))
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
        return (call,) if call else None
