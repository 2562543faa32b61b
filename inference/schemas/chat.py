"""Validation of POST /v1/chat/completions (spec 1, "Chat completion request").

Plain dict checks on the parsed JSON body: the body is kept as sent except for the rewrites the
spec asks for (max_tokens migrated to max_completion_tokens, a numeric reasoning_effort turned into
its decimal string, message ``tools`` dropped outside profile A, profile rewrites).
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from inference.errors import invalid_request
from inference.schemas.base import ValidatedRequest
from inference.schemas.fields import (
    CHAT_EXTENSION_FIELDS,
    EXTENSION_FIELDS,
    SHARED_FIELDS,
    Checker,
    boolean,
    check_fields,
    check_min_tokens,
    check_model,
    check_output_constraints,
    check_stream_options_allowed,
    integer_at_least,
    integer_between,
    string,
)
from inference.schemas.profiles import (
    allows_root_role,
    apply_chat_profile,
    check_message_tools,
    detect_profile,
    invalid_role,
)

__all__ = ["validate_chat_completion"]

_ROLES = frozenset(("system", "developer", "user", "assistant", "tool", "function", "root"))
_CONTENT_OPTIONAL = frozenset(("system", "assistant"))
_MESSAGE_STRINGS = ("name", "tool_call_id", "reasoning_content", "reasoning")
_THINKING_TYPES = frozenset(("enabled", "disabled", "adaptive"))
_TOOL_CHOICE_MODES = frozenset(("none", "auto", "required"))
_RESPONSE_FORMAT_TYPES = frozenset(("text", "json_object", "json_schema"))


def _check_logit_bias(value: Any, param: str) -> None:
    if type(value) is not dict:
        raise invalid_request(f"{param} must be an object mapping token IDs to numbers", param)
    for bias in value.values():
        kind = type(bias)
        if kind is not int and kind is not float:
            raise invalid_request(f"{param} values must be numbers", param)


def _check_tools(value: Any, param: str) -> None:
    if type(value) is not list:
        raise invalid_request(f"{param} must be an array", param)
    for i, tool in enumerate(value):
        if type(tool) is not dict:
            raise invalid_request(f"{param}[{i}] must be an object", f"{param}[{i}]")
        if tool.get("type", "function") != "function":
            continue
        function = tool.get("function")
        if type(function) is not dict or type(function.get("name")) is not str:
            at = f"{param}[{i}].function.name"
            raise invalid_request(f"{at} must be a string", at)


def _check_reasoning_effort(value: Any, param: str) -> None:
    kind = type(value)
    if kind is str or kind is int:
        return
    if kind is not float:
        raise invalid_request(f"{param} must be a string or a number", param)
    if not math.isfinite(value):
        raise invalid_request(f"{param} must be a finite number", param)


def _check_thinking(value: Any, param: str) -> None:
    if type(value) is not dict:
        raise invalid_request(f"{param} must be an object", param)
    kind = value.get("type")
    if kind is not None and (type(kind) is not str or kind not in _THINKING_TYPES):
        raise invalid_request(f"{param}.type must be one of enabled, disabled, adaptive", f"{param}.type")
    for key in ("effort", "keep"):
        if value.get(key) is not None:
            string(value[key], f"{param}.{key}")
    if value.get("clear_thinking") is not None:
        boolean(value["clear_thinking"], f"{param}.clear_thinking")


def _check_response_format(value: Any, param: str) -> None:
    if type(value) is not dict:
        raise invalid_request(f"{param} must be an object", param)
    kind = value.get("type")
    if type(kind) is not str or kind not in _RESPONSE_FORMAT_TYPES:
        raise invalid_request(
            f"{param}.type must be one of text, json_object, json_schema", f"{param}.type"
        )
    if kind != "json_schema":
        return
    spec = value.get("json_schema")
    at = f"{param}.json_schema"
    if type(spec) is not dict:
        raise invalid_request(f"{at} must be an object", at)
    name = spec.get("name")
    if type(name) is not str or not name:
        raise invalid_request(f"{at}.name must be a non-empty string", f"{at}.name")
    if type(spec.get("schema")) is not dict:
        raise invalid_request(f"{at}.schema must be a JSON object", f"{at}.schema")
    if spec.get("strict") is not None:
        boolean(spec["strict"], f"{at}.strict")


_FIELDS: dict[str, Checker] = {
    **SHARED_FIELDS,
    **EXTENSION_FIELDS,
    **CHAT_EXTENSION_FIELDS,
    "max_completion_tokens": integer_at_least(1),
    "max_tokens": integer_at_least(1),
    "n": integer_between(1, 10),
    "logprobs": boolean,
    "top_logprobs": integer_between(0, 20),
    "logit_bias": _check_logit_bias,
    "tools": _check_tools,
    "parallel_tool_calls": boolean,
    "response_format": _check_response_format,
    "reasoning_effort": _check_reasoning_effort,
    "thinking": _check_thinking,
}


def _check_content(message: dict[str, Any], index: int, role: str) -> None:
    content = message.get("content")
    if content is None:
        if role in _CONTENT_OPTIONAL:
            return
        raise invalid_request(f"messages[{index}].content is required", f"messages[{index}].content")
    kind = type(content)
    if kind is not str and kind is not list:
        raise invalid_request(
            f"messages[{index}].content must be a string or an array", f"messages[{index}].content"
        )
    if not content and role == "user":
        raise invalid_request(
            f"messages[{index}].content must not be empty", f"messages[{index}].content"
        )


def _check_message_extras(message: dict[str, Any], index: int) -> None:
    for key in _MESSAGE_STRINGS:
        value = message.get(key)
        if value is not None and type(value) is not str:
            raise invalid_request(f"messages[{index}].{key} must be a string", f"messages[{index}].{key}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and type(tool_calls) is not list:
        at = f"messages[{index}].tool_calls"
        raise invalid_request(f"{at} must be an array", at)


def _check_messages(messages: Any, root_allowed: bool) -> tuple[bool, bool]:
    """Baseline message rules. Returns (has a root message, has a message-level tools key)."""
    if messages is None:
        raise invalid_request("messages is required", "messages")
    if type(messages) is not list:
        raise invalid_request("messages must be an array", "messages")
    if not messages:
        raise invalid_request("messages must not be empty", "messages")
    has_root = has_tools = False
    for index, message in enumerate(messages):
        if type(message) is not dict:
            raise invalid_request(f"messages[{index}] must be an object", f"messages[{index}]")
        role = message.get("role")
        if type(role) is not str or role not in _ROLES:
            param = f"messages[{index}].role"
            raise invalid_request(
                f"invalid_role: {param} must be one of system, developer, user, assistant, tool, "
                "function (root only for MiniMax models)",
                param,
            )
        if role == "root":
            if not root_allowed:
                raise invalid_role(index)
            has_root = True
        _check_content(message, index, role)
        if len(message) > 2 or "content" not in message:
            _check_message_extras(message, index)
            if "tools" in message:
                has_tools = True
        if role == "tool" and message.get("tool_call_id") is None:
            at = f"messages[{index}].tool_call_id"
            raise invalid_request(f"{at} is required for role tool", at)
    return has_root, has_tools


def _tool_names(body: dict[str, Any]) -> set[str]:
    """Names of the function tools in ``tools`` (shapes already checked by _check_tools)."""
    return {
        tool["function"]["name"]
        for tool in body.get("tools") or ()
        if tool.get("type", "function") == "function"
    }


def _require_tool(name: Any, param: str, tool_names: set[str]) -> None:
    if type(name) is not str:
        raise invalid_request(f"{param} must be a string", param)
    if name not in tool_names:
        raise invalid_request(f"{param} '{name}' does not match any tool in tools", param)


def _require_tools(tool_names: set[str]) -> None:
    if not tool_names:
        raise invalid_request("tool_choice other than none or auto requires tools", "tool_choice")


def _check_tool_choice(choice: Any, tool_names: set[str]) -> None:
    if type(choice) is str:
        if choice not in _TOOL_CHOICE_MODES:
            raise invalid_request("tool_choice must be none, auto, required or an object", "tool_choice")
        if choice == "required":
            _require_tools(tool_names)
        return
    if type(choice) is not dict:
        raise invalid_request("tool_choice must be a string or an object", "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        function = choice.get("function")
        if type(function) is not dict:
            raise invalid_request("tool_choice.function must be an object", "tool_choice.function")
        _require_tools(tool_names)
        _require_tool(function.get("name"), "tool_choice.function.name", tool_names)
    elif kind == "allowed_tools":
        _check_allowed_tools(choice, tool_names)
    else:
        raise invalid_request("tool_choice.type must be function or allowed_tools", "tool_choice.type")


def _check_allowed_tools(choice: dict[str, Any], tool_names: set[str]) -> None:
    spec, at = choice, "tool_choice"
    nested = choice.get("allowed_tools")
    if nested is not None:  # OpenAI's form {type, allowed_tools: {mode, tools}}
        if type(nested) is not dict:
            raise invalid_request("tool_choice.allowed_tools must be an object", "tool_choice.allowed_tools")
        spec, at = nested, "tool_choice.allowed_tools"
    mode = spec.get("mode")
    if mode != "auto" and mode != "required":
        raise invalid_request(f"{at}.mode must be auto or required", f"{at}.mode")
    tools = spec.get("tools")
    if type(tools) is not list or not tools:
        raise invalid_request(f"{at}.tools must be a non-empty array", f"{at}.tools")
    _require_tools(tool_names)
    for i, entry in enumerate(tools):
        function = entry.get("function") if type(entry) is dict else None
        name = function.get("name") if type(function) is dict else None
        if name is None and type(entry) is dict:
            name = entry.get("name")  # flat {type: function, name}
        _require_tool(name, f"{at}.tools[{i}].function.name", tool_names)


def _decimal_string(number: int | float) -> str:
    text = repr(number)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text


def _json_constraint(response_format: Any) -> str | None:
    if response_format is None:
        return None
    kind = response_format["type"]
    return None if kind == "text" else f"a {kind} response_format"


def validate_chat_completion(body: dict[str, Any]) -> ValidatedRequest:
    """Check a chat completion body against spec 1; rewrite it in place where the spec says so."""
    model = check_model(body)
    profile = detect_profile(model)
    messages: list[dict[str, Any]] = body.get("messages")  # type: ignore[assignment]  # checked next
    has_root, has_message_tools = _check_messages(messages, allows_root_role(profile))

    check_fields(body, _FIELDS)

    get = body.get
    modified = False
    check_stream_options_allowed(body)
    if get("top_logprobs") is not None and get("logprobs") is not True:
        raise invalid_request("top_logprobs requires logprobs to be true", "top_logprobs")
    if get("max_completion_tokens") is None and get("max_tokens") is not None:
        body["max_completion_tokens"] = body.pop("max_tokens")
        modified = True
    check_min_tokens(body, "max_completion_tokens")
    check_output_constraints(body, _json_constraint(get("response_format")))
    effort = get("reasoning_effort")
    if effort is not None and type(effort) is not str:
        body["reasoning_effort"] = _decimal_string(effort)
        modified = True

    tool_names: set[str] | None = None
    if has_message_tools:
        tool_names = _tool_names(body)
        if check_message_tools(messages, profile, tool_names):
            modified = True
    tool_choice = get("tool_choice")
    if tool_choice is not None and tool_choice != "auto" and tool_choice != "none":
        _check_tool_choice(tool_choice, _tool_names(body) if tool_names is None else tool_names)
    if profile is not None and apply_chat_profile(body, profile, has_root):
        modified = True
    return ValidatedRequest(body=body, model=model, stream=get("stream") is True, modified=modified)
