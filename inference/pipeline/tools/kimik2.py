"""Kimi K2 (profile A)::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The call ID is the model's own ``functions.get_weather:0`` (kept unchanged, as the spec keeps
model-specific ID formats); the name is the part between ``functions.`` and ``:index``.
"""

from __future__ import annotations

import json

from inference.pipeline.tools.base import (
    ParsedCall,
    TaggedToolParser,
    arguments_json,
)
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["KimiK2ToolParser"]

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"


@TOOL_PARSERS.register("kimik2", "kimi_k2")
class KimiK2ToolParser(TaggedToolParser):
    start_markers = (CALL_BEGIN,)
    drop_markers = (SECTION_BEGIN, SECTION_END)
    special_markers = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END, ARGUMENT_BEGIN)

    end_marker = CALL_END

    def _calls_in(self, body: str) -> tuple[ParsedCall, ...] | None:
        call = self._call_in(body)
        return (call,) if call else None

    @staticmethod
    def _call_in(body: str) -> ParsedCall | None:
        call_id, sep, raw = body.partition(ARGUMENT_BEGIN)
        call_id = call_id.strip()
        qualified, colon, index = call_id.rpartition(":")
        if not sep or not colon or not index.isdigit():
            return None
        name = qualified.removeprefix("functions.")
        if not name:
            return None
        try:
            arguments = arguments_json(json.loads(raw))
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
        return ParsedCall(name, arguments, call_id) if arguments is not None else None
