"""Provider profiles for chat completions (spec 1, "Provider profiles"; docs/ENGINES.md).

A profile is picked from the model name as sent: it matches when any '/'-separated segment of the
model ID starts with one of its markers, ignoring case (DeepSeek V4: a segment equal to one of four
names). When markers of several families occur, the first family in table order wins (Kimi,
MiniMax, GLM, DeepSeek V4). Every rejection names its rule at the start of the message, for example
``"temperature_not_allowed: temperature must be 0, 0.6 or 1 for Kimi K3 models"``.
"""

from __future__ import annotations

import re
from enum import Enum
from functools import lru_cache
from typing import Any

from inference.errors import GatewayError, invalid_request

__all__ = [
    "Profile",
    "detect_profile",
    "allows_root_role",
    "invalid_role",
    "check_message_tools",
    "apply_chat_profile",
]


class Profile(str, Enum):
    """Vendor profiles; the spec's letter in brackets."""

    KIMI = "kimi"  # A
    KIMI_K3 = "kimi_k3"  # A3, a sub-family of A
    MINIMAX = "minimax"  # B
    GLM = "glm"  # C
    GLM_5_3 = "glm_5_3"  # C3, a version of C
    DEEPSEEK_V4 = "deepseek_v4"  # D


_KIMI_MARKERS = ("kimi", "moonshot")
_KIMI_K3_MARKERS = ("kimi-k3", "kimi_k3")
_MINIMAX_MARKERS = ("minimax", "abab")
_GLM_MARKERS = ("glm", "zai", "z-ai")
_GLM_5_3_MARKERS = ("glm-5.3", "glm5.3", "glm_5.3", "glm-5-3", "glm5-3")
_DEEPSEEK_V4_NAMES = frozenset(
    ("deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v4.1-flash")
)

KIMI_FAMILY = frozenset((Profile.KIMI, Profile.KIMI_K3))
GLM_FAMILY = frozenset((Profile.GLM, Profile.GLM_5_3))
_NO_ADAPTIVE_THINKING = frozenset((Profile.KIMI_K3, Profile.GLM, Profile.GLM_5_3, Profile.DEEPSEEK_V4))


@lru_cache(maxsize=4096)
def detect_profile(model: str) -> Profile | None:
    """The profile of ``model`` as sent (before alias resolution), or None for the baseline."""
    segments = model.lower().split("/")
    if any(s.startswith(_KIMI_MARKERS) for s in segments):
        if any(s.startswith(_KIMI_K3_MARKERS) for s in segments):
            return Profile.KIMI_K3
        return Profile.KIMI
    if any(s.startswith(_MINIMAX_MARKERS) for s in segments):
        return Profile.MINIMAX
    if any(s.startswith(_GLM_MARKERS) for s in segments):
        if any(s.startswith(_GLM_5_3_MARKERS) for s in segments):
            return Profile.GLM_5_3
        return Profile.GLM
    if any(s in _DEEPSEEK_V4_NAMES for s in segments):
        return Profile.DEEPSEEK_V4
    return None


def _rule(rule: str, message: str, param: str | None) -> GatewayError:
    return invalid_request(f"{rule}: {message}", param)


# --- role root (all profiles; only MiniMax accepts it) -----------------------------------------


def allows_root_role(profile: Profile | None) -> bool:
    return profile is Profile.MINIMAX


def invalid_role(index: int) -> GatewayError:
    param = f"messages[{index}].role"
    return _rule("invalid_role", f"{param} 'root' is only allowed for MiniMax models", param)


def _move_root_messages_first(messages: list[Any]) -> list[Any]:
    """MiniMax: root messages move, in order, to the front as system messages."""
    roots: list[Any] = []
    rest: list[Any] = []
    for message in messages:
        if message["role"] == "root":
            message["role"] = "system"
            roots.append(message)
        else:
            rest.append(message)
    return roots + rest


# --- message-level tools (Kimi only) -----------------------------------------------------------

MAX_TOOL_NAME_LENGTH = 256
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _tools_malformed(param: str) -> GatewayError:
    return _rule("tools_malformed", f"{param} must be a list of function tool declarations", param)


def _check_declared_tools(index: int, message: dict[str, Any], names: set[str]) -> None:
    role = message["role"]
    tools = message.get("tools")
    if tools is None:
        return
    param = f"messages[{index}].tools"
    if role == "user" or role == "assistant":
        raise _rule("tools_role_restricted", f"{param} is not allowed on a {role} message", param)
    if role != "system" and role != "developer":
        return
    if type(tools) is not list:
        raise _tools_malformed(param)
    if not tools:  # an empty list renders as a plain system message
        return
    content = message.get("content")
    if content:  # non-empty string or array
        raise _rule(
            "tools_content_conflict", f"a {role} message declaring tools must have empty content", param
        )
    for j, tool in enumerate(tools):
        at = f"{param}[{j}]"
        if type(tool) is not dict:
            raise _tools_malformed(param)
        if tool.get("type") != "function":
            raise _rule("tool_type_unsupported", f"{at}.type must be 'function'", f"{at}.type")
        function = tool.get("function")
        name = function.get("name") if type(function) is dict else None
        if type(name) is not str:
            raise _tools_malformed(param)
        if len(name) > MAX_TOOL_NAME_LENGTH or _TOOL_NAME.match(name) is None:
            raise _rule(
                "tool_name_invalid",
                f"{at}.function.name must match [A-Za-z_][A-Za-z0-9_]* and be at most "
                f"{MAX_TOOL_NAME_LENGTH} characters",
                f"{at}.function.name",
            )
        if name in names:
            raise _rule(
                "tool_name_duplicate", f"{at}: tool '{name}' is already declared", f"{at}.function.name"
            )
        names.add(name)


def check_message_tools(messages: list[dict[str, Any]], profile: Profile | None, names: set[str]) -> bool:
    """Message-level ``tools``: Kimi's rules, dropped for every other profile.

    ``names`` holds the request-level tool names; for Kimi the names declared on messages are added
    to it, so tool_choice may name them. Returns True when the body was rewritten.
    """
    if profile in KIMI_FAMILY:
        for index, message in enumerate(messages):
            if "tools" in message:
                _check_declared_tools(index, message, names)
        return False
    modified = False
    for message in messages:
        if "tools" in message:
            del message["tools"]
            modified = True
    return modified


# --- request-level rules -----------------------------------------------------------------------

_K3_TEMPERATURES = (0.0, 0.6, 1.0)
_K3_TOP_P = 0.95
_K3_EFFORTS = frozenset(("low", "high", "max"))
_TOLERANCE = 1e-6


def _near(value: float, target: float) -> bool:
    return abs(value - target) < _TOLERANCE


def _check_k3_sampling(body: dict[str, Any]) -> None:
    temperature = body.get("temperature")
    if temperature is not None and not any(_near(temperature, t) for t in _K3_TEMPERATURES):
        raise _rule(
            "temperature_not_allowed", "temperature must be 0, 0.6 or 1 for Kimi K3 models", "temperature"
        )
    top_p = body.get("top_p")
    if top_p is not None and not _near(top_p, _K3_TOP_P):
        raise _rule("top_p_not_allowed", "top_p must be 0.95 for Kimi K3 models", "top_p")
    for field in ("presence_penalty", "frequency_penalty"):
        penalty = body.get(field)
        if penalty is not None and not _near(penalty, 0.0):
            raise _rule(f"{field}_not_allowed", f"{field} must be 0 for Kimi K3 models", field)
    n = body.get("n")
    if n is not None and n != 1:
        raise _rule("n_not_allowed", "n must be 1 for Kimi K3 models", "n")


def _check_profile_thinking(thinking: dict[str, Any], profile: Profile) -> None:
    kind = thinking.get("type")
    if kind == "adaptive" and profile in _NO_ADAPTIVE_THINKING:
        raise _rule(
            "thinking_type_not_supported",
            "thinking.type 'adaptive' is not supported for this model; use enabled or disabled",
            "thinking.type",
        )
    if kind == "disabled" and profile is Profile.GLM_5_3:
        raise _rule(
            "thinking_disabled_not_supported",
            "thinking cannot be disabled for GLM-5.3 models",
            "thinking.type",
        )
    if profile is Profile.KIMI_K3:
        effort = thinking.get("effort")
        if effort is not None and effort not in _K3_EFFORTS:
            raise _rule(
                "thinking_effort_invalid",
                "thinking.effort must be low, high or max for Kimi K3 models",
                "thinking.effort",
            )


def _check_tool_call_ids(messages: list[dict[str, Any]]) -> None:
    """MiniMax: every tool-call ID is unique in the history; a tool message answers a pending call."""
    seen: set[str] = set()
    pending: set[str] = set()
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                call_id = call.get("id") if type(call) is dict else None
                if type(call_id) is not str:
                    continue
                if call_id in seen:
                    param = f"messages[{index}].tool_calls"
                    raise _rule("tool_call_id_duplicate", f"tool call id '{call_id}' is used twice", param)
                seen.add(call_id)
                pending.add(call_id)
        elif role == "tool":
            call_id = message["tool_call_id"]
            if call_id not in pending:
                param = f"messages[{index}].tool_call_id"
                raise _rule(
                    "tool_call_id_mismatch", f"tool message answers no pending tool call '{call_id}'", param
                )
            pending.discard(call_id)


def _forced_tool_choice(tool_choice: Any) -> bool:
    if tool_choice == "required":
        return True
    if type(tool_choice) is not dict:
        return False
    kind = tool_choice.get("type")
    if kind == "function":
        return True
    if kind == "allowed_tools":
        nested = tool_choice.get("allowed_tools")
        spec = nested if type(nested) is dict else tool_choice
        return spec.get("mode") == "required"
    return False


def _deepseek_thinking_on(body: dict[str, Any]) -> bool:
    """DeepSeek V4 thinks unless the request turns it off (spec 1, Thinking control, rule order)."""
    kwargs = body.get("chat_template_kwargs") or {}
    for key in ("thinking", "enable_thinking"):
        toggle = kwargs.get(key)
        if type(toggle) is bool:
            return toggle
    thinking = body.get("thinking") or {}
    effort = kwargs.get("reasoning_effort")
    if effort is None:
        effort = thinking.get("effort")
    if effort is None:
        effort = body.get("reasoning_effort")
    if effort is not None:
        return effort != "none"
    return thinking.get("type") != "disabled"


def apply_chat_profile(body: dict[str, Any], profile: Profile, has_root: bool) -> bool:
    """Apply a profile's request rules and rewrites to a validated chat body.

    Runs after the baseline checks, so every field present has its baseline type. Returns True when
    the body was rewritten.
    """
    modified = False
    thinking = body.get("thinking")
    if profile in KIMI_FAMILY:
        if profile is Profile.KIMI_K3:
            _check_k3_sampling(body)
        if body.get("stream") is True:
            options = body.get("stream_options")
            if options is None:
                body["stream_options"] = {"include_usage": True}
                modified = True
            elif options.get("include_usage") is None:
                options["include_usage"] = True
                modified = True
    elif profile is Profile.MINIMAX:
        messages = body["messages"]
        _check_tool_call_ids(messages)
        if has_root:
            body["messages"] = _move_root_messages_first(messages)
            modified = True
    elif profile is Profile.DEEPSEEK_V4:
        if _forced_tool_choice(body.get("tool_choice")) and _deepseek_thinking_on(body):
            raise _rule(
                "tool_choice_not_supported",
                "a forced tool_choice is not supported while thinking is on for DeepSeek V4 models; "
                "use tool_choice auto or disable thinking",
                "tool_choice",
            )
    if thinking:
        _check_profile_thinking(thinking, profile)
    return modified
