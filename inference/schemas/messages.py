"""Validation of POST /v1/messages and POST /v1/messages/count_tokens (spec 1, "Messages-style API",
"Token counting", "Errors": Messages API error sources, "Limits").

Plain dict checks in one pass over the messages and their blocks; the body is never rewritten and
unmodelled fields (context_management, output_config, cache_control, ...) stay as sent. Two classes of
400, as the spec says the reference gateway answers:

- a field missing or of the wrong JSON type (model, messages, max_tokens; an optional field, a
  message's or a block's field of the wrong type): code ``json_parse_error``, param null (the
  reference deserializes the body into typed structs, where these are parse failures);
- a rule violation: numeric code 400 with param naming the field (max_tokens < 1, an empty model or
  messages, an unknown role or block type, mcp_tool_use/mcp_tool_result blocks, the tool_choice and
  thinking shapes, service_tier, stop_sequences, custom tools' name and input_schema, mcp_servers with
  an mcp_toolset). Inside ``thinking`` and ``tool_choice`` objects every wrong field is a rule
  violation: budget_tokens only with enabled, display (summarized or omitted) only with enabled or
  adaptive.

JSON null is "unset" for every optional field. Blocks nested in a tool_result take text, image,
document, search_result and tool_reference; a search_result's content and ``system`` take text blocks.

Besides the body, the validators hand over :class:`MessagesRequest`, a frozen typed reading for the
served pipeline's mapping (``ValidatedRequest.parsed``), built in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from inference.errors import GatewayError, invalid_request, json_parse_error
from inference.schemas.base import ValidatedRequest

__all__ = [
    "ACCEPTED_BLOCK_TYPES",
    "CustomTool",
    "MessagesRequest",
    "Thinking",
    "ToolChoice",
    "validate_count_tokens",
    "validate_messages",
]

ToolChoiceKind = Literal["auto", "any", "tool", "none"]
ThinkingKind = Literal["enabled", "adaptive", "disabled"]
ThinkingDisplay = Literal["summarized", "omitted"]

_TOOL_CHOICE_KINDS: dict[str, ToolChoiceKind] = {"auto": "auto", "any": "any", "tool": "tool", "none": "none"}
_THINKING_KINDS: dict[str, ThinkingKind] = {"enabled": "enabled", "adaptive": "adaptive", "disabled": "disabled"}
_DISPLAYS: dict[str, ThinkingDisplay] = {"summarized": "summarized", "omitted": "omitted"}
_ROLES = frozenset(("user", "assistant", "system"))
_SERVICE_TIERS = frozenset(("auto", "standard_only"))
_MCP_BLOCK_TYPES = frozenset(("mcp_tool_use", "mcp_tool_result"))

_NONE = type(None)
_STR: tuple[type, ...] = (str,)
_OBJECT: tuple[type, ...] = (dict,)
_ARRAY: tuple[type, ...] = (list,)
_NUMBER: tuple[type, ...] = (int, float)  # type(True) is bool: booleans are not numbers here

# A block's typed fields: (name, accepted JSON types, what the error says is expected). A field that
# may be absent lists NoneType among its types.
_Fields = tuple[tuple[str, tuple[type, ...], str], ...]
_ID_NAME_INPUT: _Fields = (("id", _STR, "a string"), ("name", _STR, "a string"), ("input", _OBJECT, "an object"))
_TEXT: _Fields = (("text", _STR, "a string"),)
_SOURCE_OBJECT: _Fields = (("source", _OBJECT, "an object"),)
_SEARCH_RESULT: _Fields = (
    ("source", _STR, "a string"), ("title", _STR, "a string"), ("content", _ARRAY, "an array of text blocks"),
)  # fmt: skip
_TOOL_REFERENCE: _Fields = (("tool_name", _STR, "a string"),)

_BLOCKS: dict[str, _Fields] = {
    "text": _TEXT,
    "image": _SOURCE_OBJECT,
    "document": _SOURCE_OBJECT,
    "tool_use": _ID_NAME_INPUT,
    "tool_result": (
        ("tool_use_id", _STR, "a string"),
        ("content", (str, list, _NONE), "a string or an array of blocks"),
        ("is_error", (bool, _NONE), "a boolean"),
    ),
    "thinking": (("thinking", _STR, "a string"), ("signature", _STR, "a string")),
    "redacted_thinking": (("data", _STR, "a string"),),
    "server_tool_use": _ID_NAME_INPUT,
    "search_result": _SEARCH_RESULT,
    "web_search_tool_result": (("tool_use_id", _STR, "a string"), ("content", (list, dict), "an array or an object")),
    "tool_search_tool_result": (("tool_use_id", _STR, "a string"), ("content", _OBJECT, "an object")),
    "tool_reference": _TOOL_REFERENCE,
}
ACCEPTED_BLOCK_TYPES: tuple[str, ...] = tuple(_BLOCKS)
"""Block types accepted in messages (spec 1); any other type is a 400."""

_TOOL_RESULT_BLOCKS: dict[str, _Fields] = {
    kind: _BLOCKS[kind] for kind in ("text", "image", "document", "search_result", "tool_reference")
}
_TEXT_BLOCKS: dict[str, _Fields] = {"text": _TEXT}

# Optional top-level fields of /v1/messages whose JSON type is all the spec says about them.
_OPTIONAL_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "stream": ((bool,), "a boolean"),
    "temperature": (_NUMBER, "a number"),
    "top_p": (_NUMBER, "a number"),
    "top_k": ((int,), "an integer"),
    "metadata": (_OBJECT, "an object"),
    "container": ((dict, str), "an object or a string"),  # the anthropic SDK sends a container id as a string
    "mcp_servers": ((list,), "an array"),
    "rid": (_STR, "a string"),
}


@dataclass(frozen=True, slots=True)
class CustomTool:
    """A custom tool (type absent or ``custom``): what the template and the tool parser get."""

    name: str
    description: str | None
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolChoice:
    kind: ToolChoiceKind
    name: str | None  # the tool named by kind "tool"; None otherwise


@dataclass(frozen=True, slots=True)
class Thinking:
    kind: ThinkingKind
    budget_tokens: int | None  # kind "enabled" only
    display: ThinkingDisplay | None


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A Messages (or count_tokens) body that passed validation, read once for the served pipeline.

    ``messages`` is the body's own list (not copied). ``other_tools`` are the tool entries that are not
    custom tools (mcp_toolset, bash, text editor, web search, tool search, ...), as sent. On
    count_tokens, ``max_tokens`` is None and the fields that route ignores (sampling, stop_sequences,
    stream, metadata) read as unset.
    """

    model: str
    max_tokens: int | None
    system: tuple[str, ...]
    messages: list[dict[str, Any]]
    custom_tools: tuple[CustomTool, ...]
    other_tools: tuple[dict[str, Any], ...]
    tool_choice: ToolChoice | None
    thinking: Thinking | None
    stop_sequences: tuple[str, ...]
    temperature: float | None
    top_p: float | None
    top_k: int | None
    stream: bool
    user_id: str | None
    has_mcp_toolset: bool


# --- errors -----------------------------------------------------------------------------------------


def _wrong_type(value: Any, param: str, expected: str) -> GatewayError:
    """A missing field (absent or null) or one of the wrong JSON type: json_parse_error."""
    if value is None:
        return json_parse_error(f"Invalid request body: missing field {param}")
    return json_parse_error(f"Invalid request body: {param} must be {expected}")


def _block_path(i: int, j: int, inner: str) -> str:
    return f"messages[{i}].content[{j}]{inner}"


# --- blocks -----------------------------------------------------------------------------------------


def _check_block(block: Any, accepted: dict[str, _Fields], i: int, j: int, inner: str = "") -> None:
    """One content block of ``messages[i].content[j]`` (``inner``: the path below it, for nested
    blocks). Paths are only formatted on failure."""
    if type(block) is not dict:
        raise _wrong_type(block, _block_path(i, j, inner), "an object")
    kind = block.get("type")
    if type(kind) is not str:
        raise _wrong_type(kind, _block_path(i, j, inner) + ".type", "a string")
    fields = accepted.get(kind)
    if fields is None:
        param = _block_path(i, j, inner) + ".type"
        if kind in _MCP_BLOCK_TYPES:
            raise invalid_request(
                f"{param}: {kind} blocks are not accepted in messages (only the gateway's MCP tool loop "
                "produces them)",
                param,
            )
        raise invalid_request(
            f"{param}: block type '{kind}' is not accepted here; expected one of {', '.join(accepted)}", param
        )
    for name, kinds, expected in fields:
        value = block.get(name)
        if type(value) not in kinds:
            raise _wrong_type(value, f"{_block_path(i, j, inner)}.{name}", expected)
    if kind == "tool_result":
        content = block.get("content")
        if type(content) is list:
            for k, nested in enumerate(content):
                _check_block(nested, _TOOL_RESULT_BLOCKS, i, j, f"{inner}.content[{k}]")
    elif kind == "search_result":
        for k, nested in enumerate(block["content"]):
            _check_block(nested, _TEXT_BLOCKS, i, j, f"{inner}.content[{k}]")


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if type(messages) is not list:
        raise _wrong_type(messages, "messages", "an array")
    if not messages:
        raise invalid_request("messages must not be empty", "messages")
    for i, message in enumerate(messages):
        if type(message) is not dict:
            raise _wrong_type(message, f"messages[{i}]", "an object")
        role = message.get("role")
        if type(role) is not str:
            raise _wrong_type(role, f"messages[{i}].role", "a string")
        if role not in _ROLES:
            param = f"messages[{i}].role"
            raise invalid_request(f"{param} must be one of user, assistant, system", param)
        content = message.get("content")
        if type(content) is str:
            continue
        if type(content) is not list:
            raise _wrong_type(content, f"messages[{i}].content", "a string or an array of blocks")
        for j, block in enumerate(content):
            _check_block(block, _BLOCKS, i, j)
    return messages


def _read_system(system: Any) -> tuple[str, ...]:
    if system is None:
        return ()
    if type(system) is str:
        return (system,)
    if type(system) is not list:
        raise _wrong_type(system, "system", "a string or an array of text blocks")
    texts = []
    for i, block in enumerate(system):
        if type(block) is not dict:
            raise _wrong_type(block, f"system[{i}]", "an object")
        kind = block.get("type")
        if type(kind) is not str:
            raise _wrong_type(kind, f"system[{i}].type", "a string")
        if kind != "text":
            raise invalid_request(f"system[{i}].type must be text", f"system[{i}].type")
        text = block.get("text")
        if type(text) is not str:
            raise _wrong_type(text, f"system[{i}].text", "a string")
        texts.append(text)
    return tuple(texts)


# --- tools, tool_choice, thinking -------------------------------------------------------------------


def _read_tools(tools: Any) -> tuple[tuple[CustomTool, ...], tuple[dict[str, Any], ...], bool]:
    """(custom tools, other tools, whether an mcp_toolset entry is among them)."""
    if tools is None:
        return (), (), False
    if type(tools) is not list:
        raise _wrong_type(tools, "tools", "an array")
    custom: list[CustomTool] = []
    other: list[dict[str, Any]] = []
    has_mcp_toolset = False
    for i, tool in enumerate(tools):
        if type(tool) is not dict:
            raise _wrong_type(tool, f"tools[{i}]", "an object")
        kind = tool.get("type")
        if kind is None or kind == "custom":
            name = tool.get("name")
            if type(name) is not str:
                raise invalid_request(f"tools[{i}].name must be a string", f"tools[{i}].name")
            schema = tool.get("input_schema")
            if type(schema) is not dict:
                param = f"tools[{i}].input_schema"
                raise invalid_request(f"{param} must be a JSON Schema object", param)
            description = tool.get("description")
            if description is not None and type(description) is not str:
                raise _wrong_type(description, f"tools[{i}].description", "a string")
            custom.append(CustomTool(name, description, schema))
            continue
        if type(kind) is not str:
            raise _wrong_type(kind, f"tools[{i}].type", "a string")
        if kind == "mcp_toolset":
            has_mcp_toolset = True
        other.append(tool)
    return tuple(custom), tuple(other), has_mcp_toolset


def _read_tool_choice(choice: Any, custom: tuple[CustomTool, ...], has_tools: bool) -> ToolChoice | None:
    if choice is None:
        return None
    if type(choice) is not dict:
        raise _wrong_type(choice, "tool_choice", "an object")
    raw = choice.get("type")
    kind = _TOOL_CHOICE_KINDS.get(raw) if type(raw) is str else None
    if kind is None:
        raise invalid_request("tool_choice.type must be one of auto, any, tool, none", "tool_choice.type")
    if kind == "none":
        return ToolChoice("none", None)
    if not has_tools:
        raise invalid_request(f"tool_choice {kind} requires tools", "tool_choice")
    flag = choice.get("disable_parallel_tool_use")
    if flag is not None and type(flag) is not bool:
        raise _wrong_type(flag, "tool_choice.disable_parallel_tool_use", "a boolean")
    if kind != "tool":
        return ToolChoice(kind, None)
    name = choice.get("name")
    if type(name) is not str:
        raise invalid_request("tool_choice.name is required (a string) for type tool", "tool_choice.name")
    if not any(tool.name == name for tool in custom):
        raise invalid_request(f"tool_choice.name '{name}' does not name a custom tool in tools", "tool_choice.name")
    return ToolChoice("tool", name)


def _read_thinking(value: Any) -> Thinking | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise _wrong_type(value, "thinking", "an object")
    raw = value.get("type")
    kind = _THINKING_KINDS.get(raw) if type(raw) is str else None
    if kind is None:
        raise invalid_request("thinking.type must be one of enabled, adaptive, disabled", "thinking.type")
    budget = value.get("budget_tokens")
    if kind == "enabled":
        if type(budget) is not int or budget < 1:
            raise invalid_request(
                "thinking.budget_tokens must be an integer of at least 1 when thinking is enabled",
                "thinking.budget_tokens",
            )
    elif budget is not None:
        raise invalid_request("thinking.budget_tokens is only accepted with type enabled", "thinking.budget_tokens")
    raw_display = value.get("display")
    display: ThinkingDisplay | None = None
    if raw_display is not None:
        display = _DISPLAYS.get(raw_display) if type(raw_display) is str else None
        if display is None or kind == "disabled":
            raise invalid_request(
                "thinking.display must be summarized or omitted, with type enabled or adaptive", "thinking.display"
            )
    return Thinking(kind, budget if kind == "enabled" else None, display)


# --- top level --------------------------------------------------------------------------------------


def _model(body: Any) -> str:
    if type(body) is not dict:
        raise json_parse_error("Request body must be a JSON object")
    model = body.get("model")
    if type(model) is not str:
        raise _wrong_type(model, "model", "a string")
    if not model:
        raise invalid_request("model must not be empty", "model")
    return model


def _max_tokens(value: Any) -> int:
    if type(value) is not int:
        raise _wrong_type(value, "max_tokens", "an integer")
    if value < 1:
        raise invalid_request("max_tokens must be at least 1", "max_tokens")
    return value


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if type(value) is not list or any(type(item) is not str for item in value):
        raise invalid_request("stop_sequences must be an array of strings", "stop_sequences")
    return tuple(value)


def _user_id(metadata: dict[str, Any] | None) -> str | None:
    if metadata is None:
        return None
    user_id = metadata.get("user_id")
    if user_id is not None and type(user_id) is not str:
        raise _wrong_type(user_id, "metadata.user_id", "a string")
    return user_id


def _read(body: Any, *, count_only: bool) -> MessagesRequest:
    model = _model(body)
    messages = _check_messages(body.get("messages"))
    get = body.get
    max_tokens = None if count_only else _max_tokens(get("max_tokens"))
    system = _read_system(get("system"))
    tools = get("tools")
    custom, other, has_mcp_toolset = _read_tools(tools)
    tool_choice = _read_tool_choice(get("tool_choice"), custom, bool(tools))
    thinking = _read_thinking(get("thinking"))
    if count_only:  # the route's other fields are accepted and kept, not read (spec 1, Token counting)
        return MessagesRequest(
            model, None, system, messages, custom, other, tool_choice, thinking, (), None, None, None, False, None,
            has_mcp_toolset,
        )  # fmt: skip

    for key, (kinds, expected) in _OPTIONAL_TYPES.items():
        value = get(key)
        if value is not None and type(value) not in kinds:
            raise _wrong_type(value, key, expected)
    stop_sequences = _stop_sequences(get("stop_sequences"))
    tier = get("service_tier")
    if tier is not None and (type(tier) is not str or tier not in _SERVICE_TIERS):
        raise invalid_request("service_tier must be auto or standard_only", "service_tier")
    if has_mcp_toolset and not get("mcp_servers"):
        raise invalid_request("mcp_servers is required when tools has an mcp_toolset entry", "mcp_servers")
    return MessagesRequest(
        model=model,
        max_tokens=max_tokens,
        system=system,
        messages=messages,
        custom_tools=custom,
        other_tools=other,
        tool_choice=tool_choice,
        thinking=thinking,
        stop_sequences=stop_sequences,
        temperature=get("temperature"),
        top_p=get("top_p"),
        top_k=get("top_k"),
        stream=get("stream") is True,
        user_id=_user_id(get("metadata")),
        has_mcp_toolset=has_mcp_toolset,
    )


def validate_messages(body: Any) -> ValidatedRequest:
    """Check a POST /v1/messages body against spec 1; the body is kept as sent."""
    request = _read(body, count_only=False)
    return ValidatedRequest(body=body, model=request.model, stream=request.stream, modified=False, parsed=request)


def validate_count_tokens(body: Any) -> ValidatedRequest:
    """Check a POST /v1/messages/count_tokens body: model, messages, system, tools, tool_choice and
    thinking as on /v1/messages; no max_tokens; every other field accepted and kept unread (the route
    never streams, so ``stream`` is False whatever the body says)."""
    request = _read(body, count_only=True)
    return ValidatedRequest(body=body, model=request.model, stream=False, modified=False, parsed=request)
