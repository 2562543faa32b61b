"""Pythonic tool calls (Llama 3.2 / 4 and others prompted to answer with Python): a list of
calls with keyword arguments, at the start of the output or inside Llama 4's
``<|python_start|>…<|python_end|>``::

    [get_weather(city="Paris", days=3), get_time(zone='CET')]

Argument values are Python literals (strings, numbers, True/False/None, lists, dicts), converted
to JSON. Anything else (positional arguments, expressions, trailing text) means the output was
not a tool call and stays content. Decided at the end of the output.
"""

from __future__ import annotations

import ast
import json

from inference.pipeline.tools.base import ParsedCall, RegionResult, ToolParser
from inference.pipeline.tools.registry import TOOL_PARSERS

__all__ = ["PythonicToolParser"]

START, END = "<|python_start|>", "<|python_end|>"


def _function_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _function_name(node.value)
        return f"{owner}.{node.attr}" if owner else None
    return None


def _calls_in(source: str) -> tuple[ParsedCall, ...] | None:
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls: list[ParsedCall] = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _function_name(node.func)
        if name is None:
            return None
        arguments: dict[str, object] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        try:
            calls.append(ParsedCall(name, json.dumps(arguments, ensure_ascii=False)))
        except (TypeError, ValueError, RecursionError):
            return None
    return tuple(calls)


@TOOL_PARSERS.register("pythonic", "llama4_pythonic")
class PythonicToolParser(ToolParser):
    start_markers = (START,)
    special_markers = (START, END)

    def _opens_at_start(self, text: str) -> bool | None:
        return text.startswith("[")

    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        if not region.startswith(START):
            return RegionResult(len(region), _calls_in(region)) if final else None
        end = region.find(END, len(START))
        if end < 0:
            return RegionResult(len(region), _calls_in(region[len(START) :])) if final else None
        return RegionResult(end + len(END), _calls_in(region[len(START) : end]))
