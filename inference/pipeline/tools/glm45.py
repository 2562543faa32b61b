"""GLM 4.5 / 4.6 / 4.7 (profile C): the name, then each argument as a key/value pair::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

(GLM-4.7 writes the same without the newlines.) A value stays a string when the tool's schema
says so; otherwise it is read as JSON when it is JSON (numbers, booleans, objects), else a string.
"""

from __future__ import annotations

import json
import re

from inference.pipeline.tools.base import ParsedCall, TaggedToolParser, typed_value
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["Glm45ToolParser"]

START, END = "<tool_call>", "</tool_call>"
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)


@TOOL_PARSERS.register("glm45", "glm4_moe", "glm47", "glm47_moe")
class Glm45ToolParser(TaggedToolParser):
    start_markers = (START,)

    end_marker = END

    def _calls_in(self, body: str) -> tuple[ParsedCall, ...] | None:
        call = self._call_in(body)
        return (call,) if call else None

    def _call_in(self, body: str) -> ParsedCall | None:
        first = body.find("<arg_key>")
        name = (body if first < 0 else body[:first]).strip()
        if not name or "<" in name or "\n" in name:
            return None
        arguments: dict[str, object] = {}
        at = len(body) if first < 0 else first
        while at < len(body):
            pair = _PAIR.match(body, at)
            if pair is None:
                return None
            key = pair.group(1).strip()
            arguments[key] = typed_value(pair.group(2), self._schema(name, key))
            at = pair.end()
        return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))
