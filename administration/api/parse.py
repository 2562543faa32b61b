"""The parser utilities (spec 3, Other control-plane routes; control-plane auth): the gateway's own
tool-call and reasoning parsers run over a text the caller sends, nothing sent to a worker.

* ``POST /parse/function_call``: ``{text, tool_call_parser, tools?}`` → ``{remaining_text,
  tool_calls: [{function: {name, arguments}}], success: true}``;
* ``POST /parse/reasoning``: ``{text, reasoning_parser}`` → ``{normal_text, reasoning_text,
  success: true}``.

The shapes are the reference gateway's (its ``ParseFunctionCallRequest`` / ``SeparateReasoningRequest``
and the handlers answering them); SGLang's ``/parse_function_call`` and ``/separate_reasoning`` carry
the same content under other names (``normal_text`` and ``calls`` of ``{tool_index, name,
parameters}``; ``text`` and ``reasoning_text``). ``arguments`` is the call's arguments as JSON text;
``tools`` are OpenAI function tools (``{type, function: {name, description?, parameters?, strict?}}``)
whose ``parameters`` type the values of the XML-style formats (GLM, MiniMax). Unlike the reference
gateway, ``tools`` may be left out (no tools). A parser name is one the gateway knows for
``--tool-call-parser`` / ``--reasoning-parser`` (case and ``-``/``_`` ignored).

Every refusal is 400 in the general admin body ``{"error": {"message", "type": "bad_request"}}``
(spec 3, Errors): a body that is not a JSON object (the control plane's reader: orjson, its depth
limit included), a missing or wrongly typed field, an unknown parser name (the message lists the
known ones), or a text the parser could not read (the reference gateway's "Failed to parse" 400).
Where the reference gateway differs: its refusals are ``{"error": <message>, "success": false}``, and a
body that does not deserialize is a plain-text 415 / 400 / 422. A body over the control plane's limit
(``DATA_UPLOAD_MAX_MEMORY_SIZE``) is 413 before the view reads it (gateway_project/urls.py).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Mapping, TypedDict

import orjson
from django.http import HttpResponse
from rest_framework.request import Request
from rest_framework.response import Response

from administration.api.errors import ErrorType, error_body
from administration.api.methods import ControlPlaneView
from inference.pipeline.parsers import UnknownParser, reasoning_parser_class, tool_parser_class
from inference.pipeline.tools import ToolSchemas

__all__ = [
    "FunctionCallView", "ReasoningView", "ParseBodyError", "ParsedFunctionCalls", "SeparatedReasoning",
    "ToolCallItem", "parse_function_call", "separate_reasoning", "tool_schemas",
]  # fmt: skip

logger = logging.getLogger(__name__)

_NAME_SHOWN = 100  # characters of an unknown parser name repeated in the message


class FunctionCallItem(TypedDict):
    name: str
    arguments: str


class ToolCallItem(TypedDict):
    """One call, as the reference gateway's parsers serialize it (no id, no type)."""

    function: FunctionCallItem


class ParsedFunctionCalls(TypedDict):
    """The answer of /parse/function_call."""

    remaining_text: str
    tool_calls: list[ToolCallItem]
    success: Literal[True]


class SeparatedReasoning(TypedDict):
    """The answer of /parse/reasoning."""

    normal_text: str
    reasoning_text: str
    success: Literal[True]


class ParseBodyError(Exception):
    """The request cannot be parsed as asked (answered 400 bad_request with this message)."""


# --- reading the body ---------------------------------------------------------------------------------


def _object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw or b"")
    except orjson.JSONDecodeError as exc:
        raise ParseBodyError(f"The body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ParseBodyError("The body must be a JSON object")
    return body


def _string(body: Mapping[str, Any], name: str, where: str = "") -> str:
    value = body.get(name)
    if value is None:
        raise ParseBodyError(f"'{where}{name}' is required")
    if not isinstance(value, str):
        raise ParseBodyError(f"'{where}{name}' must be a string")
    return value


def _optional(body: Mapping[str, Any], name: str, kind: type, label: str, where: str) -> None:
    """A field that may be absent or null, else of ``kind``."""
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise ParseBodyError(f"'{where}{name}' must be {label}")


def tool_schemas(tools: Any) -> ToolSchemas:
    """The request's ``tools`` as function name → parameters schema, each tool checked as the
    reference gateway's ``Tool`` reads it. Raises :class:`ParseBodyError`."""
    if not isinstance(tools, list):
        raise ParseBodyError("'tools' must be an array")
    schemas: dict[str, Mapping[str, Any]] = {}
    for index, tool in enumerate(tools):
        where = f"tools[{index}]."
        if not isinstance(tool, dict):
            raise ParseBodyError(f"'tools[{index}]' must be an object")
        _string(tool, "type", where)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ParseBodyError(f"'{where}function' is required and must be an object")
        where += "function."
        name = _string(function, "name", where)
        _optional(function, "description", str, "a string", where)
        _optional(function, "parameters", dict, "an object", where)
        _optional(function, "strict", bool, "a boolean", where)
        schemas[name] = function.get("parameters") or {}
    return schemas


def _unknown(unknown: UnknownParser) -> ParseBodyError:
    shown = unknown.name if len(unknown.name) <= _NAME_SHOWN else unknown.name[:_NAME_SHOWN] + "…"
    return ParseBodyError(f"Unknown {unknown.kind}: {shown}. Known: {', '.join(unknown.known)}")


# --- parsing --------------------------------------------------------------------------------------------


def parse_function_call(raw: bytes) -> ParsedFunctionCalls:
    """The answer to a /parse/function_call body. Raises :class:`ParseBodyError`."""
    body = _object(raw)
    text = _string(body, "text")
    name = _string(body, "tool_call_parser")
    schemas = tool_schemas(body["tools"]) if "tools" in body else {}
    try:
        parser = tool_parser_class(name)
    except UnknownParser as unknown:
        raise _unknown(unknown) from None
    try:
        parsed = parser.parse(text, tools=schemas)
    except Exception as exc:  # a parser's limit (JSON nested past Python's recursion limit): the caller's text
        logger.warning("tool parser %s failed on a /parse/function_call text", parser.__name__, exc_info=True)
        raise ParseBodyError(f"Failed to parse function calls: {type(exc).__name__}") from None
    calls: list[ToolCallItem] = [
        {"function": {"name": call.name, "arguments": call.arguments}} for call in parsed.tool_calls
    ]
    return {"remaining_text": parsed.content, "tool_calls": calls, "success": True}


def separate_reasoning(raw: bytes) -> SeparatedReasoning:
    """The answer to a /parse/reasoning body: the family's parser with its own default for whether
    the text starts inside the block (no prompt to tell). Raises :class:`ParseBodyError`."""
    body = _object(raw)
    text = _string(body, "text")
    name = _string(body, "reasoning_parser")
    try:
        parser = reasoning_parser_class(name)
    except UnknownParser as unknown:
        raise _unknown(unknown) from None
    try:
        parsed = parser.parse(text)
    except Exception as exc:  # never expected (no JSON is read); kept a 400 like the tool route
        logger.warning("reasoning parser %s failed on a /parse/reasoning text", parser.__name__, exc_info=True)
        raise ParseBodyError(f"Failed to separate reasoning: {type(exc).__name__}") from None
    return {"normal_text": parsed.content, "reasoning_text": parsed.reasoning, "success": True}


# --- views ----------------------------------------------------------------------------------------------


class _ParseView(ControlPlaneView):
    def handle_exception(self, exc: Exception) -> Response | HttpResponse:  # type: ignore[override]  # 405 envelope
        if isinstance(exc, ParseBodyError):
            return Response(error_body(str(exc), ErrorType.BAD_REQUEST), status=400)
        response: Response | HttpResponse = super().handle_exception(exc)
        return response


class FunctionCallView(_ParseView):
    def post(self, request: Request) -> Response:
        return Response(parse_function_call(request.body))


class ReasoningView(_ParseView):
    def post(self, request: Request) -> Response:
        return Response(separate_reasoning(request.body))
