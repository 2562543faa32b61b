"""MiniMax M2 (profile B): an XML-ish section of invokes::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

Several invokes in one section are parallel calls. Values are typed as for GLM (the schema's
string stays a string, JSON is read as JSON); a newline right inside a parameter tag is not part
of the value.
"""

from __future__ import annotations

import json
import re

from inference.pipeline.tools.base import ParsedCall, TaggedToolParser, typed_value
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["MiniMaxM2ToolParser"]

START, END = "<minimax:tool_call>", "</minimax:tool_call>"
_INVOKE = re.compile(r"\s*<invoke name=(\"[^\"]*\"|'[^']*'|[^\s>]+)\s*>(.*?)</invoke>\s*", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter name=(\"[^\"]*\"|'[^']*'|[^\s>]+)\s*>(.*?)</parameter>\s*", re.DOTALL)


def _unquote(value: str) -> str:
    return value[1:-1] if value[:1] in "\"'" and value[-1:] == value[:1] and len(value) >= 2 else value


def _trim_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


@TOOL_PARSERS.register("minimax_m2", "minimax")
class MiniMaxM2ToolParser(TaggedToolParser):
    start_markers = (START,)

    end_marker = END

    def _calls_in(self, body: str) -> tuple[ParsedCall, ...] | None:
        calls: list[ParsedCall] = []
        at = 0
        while at < len(body):
            invoke = _INVOKE.match(body, at)
            if invoke is None:
                if body[at:].strip():
                    return None
                break
            name = _unquote(invoke.group(1)).strip()
            inner = invoke.group(2)
            arguments: dict[str, object] = {}
            place = 0
            while place < len(inner):
                parameter = _PARAMETER.match(inner, place)
                if parameter is None:
                    if inner[place:].strip():
                        return None
                    break
                key = _unquote(parameter.group(1)).strip()
                arguments[key] = typed_value(_trim_newline(parameter.group(2)), self._schema(name, key))
                place = parameter.end()
            if not name:
                return None
            calls.append(ParsedCall(name, json.dumps(arguments, ensure_ascii=False)))
            at = invoke.end()
        return tuple(calls) if calls else None
