"""What a chat request's ``tool_choice`` means on the gateway's own pipeline (spec 1, tool_choice).

- ``none`` (or no tools): tools are not given to the template and nothing is parsed as a call.
- ``auto``: the tools go to the template; the model's tool parser finds calls in the output.
- ``required``: the output is constrained to a JSON array of ``{name, parameters}`` objects, one
  of the tools each, and is read back as those calls.
- a named function (``{type: function, function: {name}}``): only that tool goes to the template;
  the output is constrained to its parameters' schema and is read back as one call of it.
- ``allowed_tools``: the tools are narrowed to the listed ones, then ``mode`` (auto or required)
  applies as above.

A constrained output is parsed whole at its end by :class:`ConstrainedCalls` (a tool parser with
the same feed/finish interface as the families'), so a stream sends the calls when the output ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from inference.pipeline.events import TextDelta, ToolCallDelta
from inference.pipeline.tools.base import ToolEvent, ToolSchemas, make_call_id

__all__ = ["ToolChoice", "ConstrainedCalls", "resolve_tool_choice"]

_ANY_OBJECT: Mapping[str, Any] = {"type": "object", "properties": {}}


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    function = tool.get("function")
    return function if isinstance(function, Mapping) else {}


def _name(tool: Mapping[str, Any]) -> str:
    return str(_function(tool).get("name") or "")


def _parameters(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    parameters = _function(tool).get("parameters")
    return parameters if isinstance(parameters, Mapping) else _ANY_OBJECT


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """The resolved choice: ``tools`` as the template gets them, ``mode`` (none, auto, required,
    named), the ``name`` of a named function, and the constraint ``schema`` of required or named."""

    mode: str
    tools: tuple[Mapping[str, Any], ...] = ()
    name: str | None = None
    schema: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def parses_calls(self) -> bool:
        """Whether the output may hold calls at all."""
        return self.mode != "none" and bool(self.tools)

    @property
    def constrained(self) -> bool:
        return self.schema is not None

    def schemas(self) -> ToolSchemas:
        """Function name → parameters schema (the parsers type arguments by it)."""
        return {_name(tool): _parameters(tool) for tool in self.tools}

    def template_value(self) -> Any:
        """The ``tool_choice`` variable templates read: the mode's name."""
        return "required" if self.mode == "named" else self.mode


def _required_schema(tools: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"type": "string", "enum": [_name(tool)]}, "parameters": _parameters(tool)},
                    "required": ["name", "parameters"],
                }
                for tool in tools
            ]
        },
    }


def _allowed(choice: Mapping[str, Any]) -> tuple[str, set[str]]:
    nested = choice.get("allowed_tools")
    spec: Mapping[str, Any] = nested if isinstance(nested, Mapping) else choice
    names = set()
    for entry in spec.get("tools") or ():
        if isinstance(entry, Mapping):
            names.add(str(_function(entry).get("name") or entry.get("name") or ""))
    return str(spec.get("mode") or "auto"), names


def resolve_tool_choice(body: Mapping[str, Any]) -> ToolChoice:
    """The choice of a validated chat body (validation checked every name exists)."""
    tools = tuple(
        tool for tool in body.get("tools") or () if isinstance(tool, Mapping) and tool.get("type", "function") == "function"
    )
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return ToolChoice("none")
    if choice is None or choice == "auto":
        return ToolChoice("auto", tools)
    mode = choice if isinstance(choice, str) else "auto"
    if isinstance(choice, Mapping):
        if choice.get("type") == "function":
            name = str(_function(choice).get("name"))
            chosen = tuple(tool for tool in tools if _name(tool) == name)
            return ToolChoice("named", chosen, name, _parameters(chosen[0]))
        mode, names = _allowed(choice)
        tools = tuple(tool for tool in tools if _name(tool) in names)
    if mode == "required":
        return ToolChoice("required", tools, schema=_required_schema(tools))
    return ToolChoice("auto", tools)


class ConstrainedCalls:
    """The calls of a constrained output, read when it ends; an output that is not what the
    constraint asked for is returned as text."""

    def __init__(self, choice: ToolChoice, make_id: Callable[[], str] = make_call_id) -> None:
        self._choice = choice
        self._make_id = make_id
        self._parts: list[str] = []
        self._calls = 0

    def feed(self, text: str) -> list[ToolEvent]:
        self._parts.append(text)
        return []

    @property
    def has_tool_calls(self) -> bool:
        return self._calls > 0

    def _calls_in(self, text: str) -> list[tuple[str, Any]] | None:
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if self._choice.mode == "named":
            return [(self._choice.name or "", value)] if isinstance(value, dict) else None
        if not isinstance(value, list) or not value:
            return None
        calls = []
        for item in value:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            calls.append((item["name"], item.get("parameters", item.get("arguments", {}))))
        return calls

    def finish(self) -> list[ToolEvent]:
        text = "".join(self._parts)
        self._parts.clear()
        calls = self._calls_in(text)
        if calls is None:
            return [TextDelta(text)] if text else []
        out: list[ToolEvent] = []
        for name, arguments in calls:
            index = self._calls
            self._calls += 1
            out.append(ToolCallDelta(index, self._make_id(), name))
            out.append(ToolCallDelta(index, None, None, json.dumps(arguments, ensure_ascii=False)))
        return out
