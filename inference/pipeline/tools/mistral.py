"""Mistral: ``[TOOL_CALLS]`` (a special token: decode with special tokens kept) followed by
either the v0.3 form, a JSON array (or object) of calls::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]

or the newer tokenizers' name-and-arguments form, one ``[TOOL_CALLS]`` per call, with an optional
call ID::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}

There is no closing marker (the calls end the message), so the calls are decided at the end of the
output. A model-written ID is kept.
"""

from __future__ import annotations

import json

from inference.pipeline.tools.base import (
    ParsedCall,
    RegionResult,
    ToolParser,
    arguments_json,
    call_from_object,
)
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["MistralToolParser"]

START, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_DECODER = json.JSONDecoder()


@TOOL_PARSERS.register("mistral")
class MistralToolParser(ToolParser):
    start_markers = (START,)
    special_markers = (START, ARGS, CALL_ID)

    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        if not final:
            return None
        body = region[len(START) :]
        text = body.lstrip()
        offset = len(region) - len(text)
        decided = self._json_form(text) if text[:1] in ("[", "{") else self._named_form(text)
        if decided is None:
            return RegionResult(len(region), None)
        used, calls = decided
        return RegionResult(offset + used, calls)

    @staticmethod
    def _json_form(text: str) -> tuple[int, tuple[ParsedCall, ...]] | None:
        try:
            value, end = _DECODER.raw_decode(text)
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
        items = value if isinstance(value, list) else [value]
        calls = tuple(call_from_object(item) for item in items)
        if not calls or any(call is None for call in calls):
            return None
        return end, tuple(call for call in calls if call is not None)

    @staticmethod
    def _named_form(text: str) -> tuple[int, tuple[ParsedCall, ...]] | None:
        head, sep, after = text.partition(ARGS)
        name, has_id, call_id = head.partition(CALL_ID)
        name, call_id = name.strip(), call_id.strip()
        if not sep or not name or any(c.isspace() for c in name) or (has_id and not call_id):
            return None
        raw = after.lstrip()
        try:
            value, end = _DECODER.raw_decode(raw)
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
        arguments = arguments_json(value)
        if arguments is None:
            return None
        used = len(head) + len(sep) + (len(after) - len(raw)) + end
        return used, (ParsedCall(name, arguments, call_id or None),)
