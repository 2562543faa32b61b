"""Validation of POST /v1/responses (spec 2, "Create response request", "Input items", "Tools",
"Reasoning and text format"), before any worker is chosen.

Plain checks on the parsed body, each failure the spec's 400: an unknown top-level parameter or an
unknown reasoning effort is ``json_parse_error``; a bad conversation id ``invalid_conversation_id``
(param ``conversation``); previous_response_id with conversation ``mutually_exclusive_parameters``;
a function tool whose parameters are not an object ``invalid_type``; local_shell
``tool_not_supported``; every other rule the numeric code 400 of a validation failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from inference.errors import GatewayError, invalid_request, json_parse_error
from responses_api.limits import metadata_problem

__all__ = [
    "ResponsesRequest", "validate_response_request", "EFFORT_TIERS", "MCP_BUILTINS", "hosted_vendor_model",
]  # fmt: skip

EFFORT_TIERS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SUMMARIES = frozenset(("auto", "concise", "detailed"))
ROLES = frozenset(("assistant", "system", "developer", "user"))
MCP_BUILTINS = frozenset(("web_search_preview", "code_interpreter", "file_search", "image_generation"))
"""Built-in tools the gateway runs through MCP servers configured to back them."""
FORWARDED_BUILTINS = frozenset(("web_search",))
"""Accepted with every field and forwarded to HTTP workers and external providers."""

_FIELDS = frozenset((
    "model", "input", "instructions", "max_output_tokens", "max_tool_calls", "temperature", "top_p", "stream",
    "stream_options", "store", "background", "tools", "tool_choice", "parallel_tool_calls",
    "previous_response_id", "conversation", "reasoning", "text", "include", "top_logprobs", "metadata", "user",
    "service_tier", "truncation", "prompt", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
    "context_management", "request_id", "priority",
    "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "stop",
))  # fmt: skip
_ITEM_TYPES = frozenset((
    "message", "function_call", "function_call_output", "reasoning", "mcp_list_tools", "mcp_call", "item_reference",
    "mcp_approval_response", "custom_tool_call", "custom_tool_call_output",
))  # fmt: skip
_SERVER_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_HOSTED_PREFIXES = ("gpt-", "o1", "o3", "o4", "chatgpt-", "codex-", "computer-use")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A create request that passed the spec's rules (``body`` is kept as sent)."""

    body: dict[str, Any]
    model: str
    stream: bool
    background: bool
    store: bool
    conversation: str | None
    previous_response_id: str | None


def _type_error(message: str, param: str) -> GatewayError:
    return invalid_request(message, param)


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> None:
    value = body.get(key)
    if value is None:
        return
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid_request(f"{key} must be an integer {bound}", key)


def _check_numbers(body: Mapping[str, Any]) -> None:
    temperature = body.get("temperature")
    if temperature is not None and (not _number(temperature) or not 0 <= temperature <= 2):
        raise invalid_request("temperature must be a number between 0 and 2", "temperature")
    top_p = body.get("top_p")
    if top_p is not None and (not _number(top_p) or not 0 < top_p <= 1):
        raise invalid_request("top_p must be greater than 0 and at most 1", "top_p")
    _integer(body, "max_output_tokens", 16)
    _integer(body, "max_tool_calls", 1)
    _integer(body, "top_logprobs", 0, 20)
    top_k = body.get("top_k")
    if top_k is not None and (type(top_k) is not int or (top_k != -1 and top_k < 1)):
        raise invalid_request("top_k must be -1 or at least 1", "top_k")
    for key, low, high in (("min_p", 0, 1), ("repetition_penalty", 0, 2), ("frequency_penalty", -2, 2),
                           ("presence_penalty", -2, 2)):  # fmt: skip
        value = body.get(key)
        if value is not None and (not _number(value) or not low <= value <= high):
            raise invalid_request(f"{key} must be a number between {low} and {high}", key)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
        isinstance(stop, list) and all(isinstance(item, str) and item for item in stop) and len(stop) <= 4
    ):
        raise invalid_request("stop must be a string or at most 4 non-empty strings", "stop")


def _check_flags(body: Mapping[str, Any]) -> None:
    for key in ("stream", "store", "background", "parallel_tool_calls"):
        if body.get(key) is not None and type(body[key]) is not bool:
            raise invalid_request(f"{key} must be a boolean", key)
    for key in ("instructions", "user", "previous_response_id", "safety_identifier", "prompt_cache_key"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise invalid_request(f"{key} must be a string", key)
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        raise invalid_request("stream_options must be an object", "stream_options")
    if body.get("truncation") not in (None, "auto", "disabled"):  # echoed in the response object
        raise invalid_request("truncation must be auto or disabled", "truncation")


def _check_metadata(metadata: Any) -> None:
    problem = metadata_problem(metadata) if metadata is not None else None
    if problem is not None:
        raise invalid_request(problem, "metadata")


def _check_content(content: Any, param: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise invalid_request(f"{param} must be a string or an array of content parts", param)
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise invalid_request(f"{param}[{index}] must be a content part with a type", f"{param}[{index}]")


def _check_item(item: Any, index: int) -> None:
    param = f"input[{index}]"
    if not isinstance(item, dict):
        raise invalid_request(f"{param} must be an object", param)
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in _ITEM_TYPES:
        raise invalid_request(f"{param}.type {kind!r} is not a supported input item type", f"{param}.type")
    if kind == "message":
        if item.get("role") not in ROLES:
            raise invalid_request(f"{param}.role must be one of assistant, system, developer, user", f"{param}.role")
        _check_content(item.get("content"), f"{param}.content")
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise invalid_request(f"{param}.{key} must be a string", f"{param}.{key}")
        if item.get("namespace") is not None and not isinstance(item["namespace"], str):
            raise invalid_request(f"{param}.namespace must be a string", f"{param}.namespace")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise invalid_request(f"{param}.call_id must be a string", f"{param}.call_id")
        _check_content(item.get("output"), f"{param}.output")
    elif kind == "item_reference" and not isinstance(item.get("id"), str):
        raise invalid_request(f"{param}.id must be a string", f"{param}.id")


def _check_input(value: Any) -> None:
    if isinstance(value, str):
        if not value:
            raise invalid_request("input must not be empty", "input")
        return
    if not isinstance(value, list) or not value:
        raise invalid_request("input must be a non-empty string or a non-empty array of items", "input")
    for index, item in enumerate(value):
        _check_item(item, index)


def _check_function(tool: Mapping[str, Any], param: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{param}.name must be a non-empty string", f"{param}.name")
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise GatewayError(400, "invalid_type", f"{param}.parameters must be a JSON object", param=f"{param}.parameters")
    if tool.get("strict") is not None and type(tool["strict"]) is not bool:
        raise invalid_request(f"{param}.strict must be a boolean", f"{param}.strict")
    return name


def _check_mcp(tool: Mapping[str, Any], param: str, labels: set[str]) -> None:
    label = tool.get("server_label")
    if not isinstance(label, str) or not _SERVER_LABEL.fullmatch(label):
        raise invalid_request(
            f"{param}.server_label must start with a letter and hold only letters, digits, - and _",
            f"{param}.server_label",
        )
    if label.lower() in labels:
        raise invalid_request(f"{param}.server_label {label!r} is used twice", f"{param}.server_label")
    labels.add(label.lower())
    has_url, has_connector = tool.get("server_url") is not None, tool.get("connector_id") is not None
    if has_url == has_connector:
        raise invalid_request(f"{param} needs exactly one of server_url and connector_id", param)
    for key in ("server_url", "connector_id", "server_description"):
        if tool.get(key) is not None and not isinstance(tool[key], str):
            raise invalid_request(f"{param}.{key} must be a string", f"{param}.{key}")
    allowed = tool.get("allowed_tools")
    if allowed is not None:
        names = allowed.get("tool_names") if isinstance(allowed, dict) else allowed
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise invalid_request(
                f"{param}.allowed_tools must be a list of names or {{read_only, tool_names}}", f"{param}.allowed_tools"
            )


def _check_tools(tools: Any) -> tuple[set[str], dict[str, set[str]], set[str], set[str]]:
    """Function names, namespace → member names, MCP server labels and built-in types declared."""
    if not isinstance(tools, list):
        raise invalid_request("tools must be an array", "tools")
    functions: set[str] = set()
    namespaces: dict[str, set[str]] = {}
    labels: set[str] = set()
    builtins: set[str] = set()
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid_request(f"{param} must be an object with a type", param)
        kind = tool["type"]
        if kind == "function":
            functions.add(_check_function(tool, param))
        elif kind == "namespace":
            name = tool.get("name")
            members = tool.get("tools")
            if not isinstance(name, str) or not name:
                raise invalid_request(f"{param}.name must be a non-empty string", f"{param}.name")
            if not isinstance(members, list) or not members:
                raise invalid_request(f"{param}.tools must be a non-empty array", f"{param}.tools")
            names: set[str] = set()
            for position, member in enumerate(members):
                at = f"{param}.tools[{position}]"
                if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                    raise invalid_request(f"{at} must be a function or custom tool (no nesting)", at)
                names.add(_check_function(member, at))
            namespaces[name] = names
        elif kind == "mcp":
            _check_mcp(tool, param, labels)
        elif kind == "local_shell":
            raise GatewayError(400, "tool_not_supported", "local_shell tools are not supported", param=f"{param}.type")
        elif kind in MCP_BUILTINS or kind in FORWARDED_BUILTINS or kind == "custom":
            builtins.add(kind)
        else:
            raise invalid_request(f"{param}.type {kind!r} is not a supported tool type", f"{param}.type")
    return functions, namespaces, labels, builtins


def _check_tool_choice(choice: Any, declared: tuple[set[str], dict[str, set[str]], set[str], set[str]] | None) -> None:
    if choice is None or choice == "none":
        return
    if declared is None or not any(declared):
        raise invalid_request("tool_choice other than none requires tools", "tool_choice")
    functions, namespaces, labels, builtins = declared
    if isinstance(choice, str):
        if choice not in ("auto", "required"):
            raise invalid_request("tool_choice must be none, auto, required or an object", "tool_choice")
        return
    if not isinstance(choice, dict):
        raise invalid_request("tool_choice must be a string or an object", "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        name, namespace = choice.get("name"), choice.get("namespace")
        known = namespaces.get(namespace, set()) if namespace is not None else functions
        if not isinstance(name, str) or name not in known:
            raise invalid_request(f"tool_choice names no declared function: {name!r}", "tool_choice.name")
    elif kind == "mcp":
        if str(choice.get("server_label", "")).lower() not in labels:
            raise invalid_request("tool_choice.server_label names no declared mcp tool", "tool_choice.server_label")
    elif kind == "allowed_tools":
        if choice.get("mode") not in ("auto", "required") or not isinstance(choice.get("tools"), list):
            raise invalid_request("tool_choice allowed_tools needs mode auto or required and tools", "tool_choice")
    elif kind not in builtins:
        raise invalid_request(f"tool_choice type {kind!r} names no declared tool", "tool_choice.type")


def _check_reasoning(reasoning: Any) -> None:
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise invalid_request("reasoning must be an object", "reasoning")
    effort = reasoning.get("effort")
    if effort is not None and effort not in EFFORT_TIERS:
        raise json_parse_error(f"reasoning.effort must be one of {', '.join(EFFORT_TIERS)}")
    summary = reasoning.get("summary")
    if summary is not None and summary not in SUMMARIES:
        raise invalid_request("reasoning.summary must be auto, concise or detailed", "reasoning.summary")


def _check_text(text: Any) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise invalid_request("text must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise invalid_request("text.format.type must be text, json_object or json_schema", "text.format.type")
    if fmt["type"] == "json_schema":
        if not isinstance(fmt.get("name"), str) or not fmt["name"]:
            raise invalid_request("text.format.name must be a non-empty string", "text.format.name")
        if not isinstance(fmt.get("schema"), dict):
            raise invalid_request("text.format.schema must be a JSON object", "text.format.schema")
        if fmt.get("strict") is not None and type(fmt["strict"]) is not bool:
            raise invalid_request("text.format.strict must be a boolean", "text.format.strict")


def hosted_vendor_model(model: str) -> bool:
    """Whether ``model`` names a hosted-vendor family (o-series, gpt-…, or behind an openai/ segment)."""
    segments = model.lower().split("/")
    return "openai" in segments[:-1] or segments[-1].startswith(_HOSTED_PREFIXES)


def _closed_objects(schema: Any, param: str) -> None:
    """Every object node of a strict schema sets additionalProperties: false."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
            raise invalid_request(f"{param}: strict schemas need additionalProperties: false on every object", param)
        for value in schema.values():
            _closed_objects(value, param)
    elif isinstance(schema, list):
        for value in schema:
            _closed_objects(value, param)


def _input_text(body: Mapping[str, Any]) -> str:
    found = [str(body.get("instructions") or "")]
    value = body.get("input")
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, list):
        for item in value:
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, str):
                found.append(content)
            elif isinstance(content, list):
                found.extend(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return " ".join(found)


def _check_hosted_vendor(body: Mapping[str, Any]) -> None:
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema" and fmt.get("strict") is True:
        _closed_objects(fmt.get("schema"), "text.format.schema")
    if fmt.get("type") == "json_object" and "json" not in _input_text(body).lower():
        raise invalid_request("text.format json_object needs the word json in instructions or input", "text.format")
    for index, tool in enumerate(body.get("tools") or ()):
        if tool.get("type") == "function" and tool.get("strict") is True:
            _closed_objects(tool.get("parameters"), f"tools[{index}].parameters")


def _conversation_id(value: Any) -> str | None:
    if value is None:
        return None
    found = value.get("id") if isinstance(value, dict) else value
    if not isinstance(found, str) or not found.startswith("conv_"):
        raise GatewayError(
            400, "invalid_conversation_id", "Invalid conversation ID: it must begin with 'conv_'", param="conversation"
        )
    return found


def validate_response_request(body: Any) -> ResponsesRequest:
    """Check a create request against spec 2; raises GatewayError with the spec's 400."""
    if not isinstance(body, dict):
        raise json_parse_error("the request body must be a JSON object")
    unknown = sorted(key for key in body if key not in _FIELDS)
    if unknown:
        raise json_parse_error(f"Unknown parameter: {unknown[0]}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("model must be a non-empty string", "model")
    _check_input(body.get("input"))
    _check_flags(body)
    _check_numbers(body)
    _check_metadata(body.get("metadata"))
    declared = _check_tools(body["tools"]) if body.get("tools") is not None else None
    _check_tool_choice(body.get("tool_choice"), declared)
    _check_reasoning(body.get("reasoning"))
    _check_text(body.get("text"))
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(item, str) for item in include)):
        raise invalid_request("include must be an array of strings", "include")
    conversation = _conversation_id(body.get("conversation"))
    previous = body.get("previous_response_id")
    if conversation is not None and previous is not None:
        raise GatewayError(
            400, "mutually_exclusive_parameters",
            "previous_response_id and conversation cannot be used together", param="conversation",
        )  # fmt: skip
    if hosted_vendor_model(model):
        _check_hosted_vendor(body)
    return ResponsesRequest(
        body=body,
        model=model,
        stream=body.get("stream") is True,
        background=body.get("background") is True,
        store=body.get("store") is not False,
        conversation=conversation,
        previous_response_id=previous,
    )
