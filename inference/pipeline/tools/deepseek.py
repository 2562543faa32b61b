"""DeepSeek V3 and R1 (the R1 template writes the same), with DeepSeek's own tokens::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

and V3.1 (``deepseek31``), without the type and the code fence::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Each call is decided at its ``<｜tool▁call▁end｜>``; the section markers never reach the content.
"""

from __future__ import annotations

from abc import abstractmethod

import json

from inference.pipeline.tools.base import (
    ParsedCall,
    TaggedToolParser,
    arguments_json,
)
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["DeepSeekV31ToolParser", "DeepSeekV3ToolParser"]

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


def _strip_fence(text: str) -> str | None:
    text = text.strip()
    if not text.startswith("```"):
        return text
    first_line = text.find("\n")
    if first_line < 0 or not text.endswith("```"):
        return None
    return text[first_line + 1 : -3].strip()


class _DeepSeekToolParser(TaggedToolParser):
    start_markers = (CALL_BEGIN,)
    drop_markers = (CALLS_BEGIN, CALLS_END)

    end_marker = CALL_END

    def _calls_in(self, body: str) -> tuple[ParsedCall, ...] | None:
        call = self._call_in(body)
        return (call,) if call else None

    @abstractmethod
    def _call_in(self, body: str) -> ParsedCall | None:
        """The one call in a region's body (V3 and V3.1 write it differently)."""


@TOOL_PARSERS.register("deepseek", "deepseek_v3", "deepseekv3")
class DeepSeekV3ToolParser(_DeepSeekToolParser):
    def _call_in(self, body: str) -> ParsedCall | None:
        kind, sep, rest = body.partition(SEP)
        name, newline, fenced = rest.partition("\n")
        if not sep or not newline or kind.strip() != "function" or not name.strip():
            return None
        raw = _strip_fence(fenced)
        if raw is None:
            return None
        try:
            arguments = arguments_json(json.loads(raw))
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
        return ParsedCall(name.strip(), arguments) if arguments is not None else None


@TOOL_PARSERS.register("deepseek31", "deepseek_v31", "deepseekv31")
class DeepSeekV31ToolParser(_DeepSeekToolParser):
    def _call_in(self, body: str) -> ParsedCall | None:
        name, sep, raw = body.partition(SEP)
        if not sep or not name.strip():
            return None
        try:
            arguments = arguments_json(json.loads(raw))
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
        return ParsedCall(name.strip(), arguments) if arguments is not None else None
