"""Provider profiles on chat completions (spec 1, Provider profiles; docs/ENGINES.md). Pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from inference.errors import GatewayError
from inference.schemas.chat import validate_chat_completion
from inference.schemas.profiles import Profile, detect_profile

KIMI = "moonshotai/Kimi-K2-Instruct"
K3 = "moonshotai/Kimi-K3"
MINIMAX = "MiniMaxAI/MiniMax-M2"
GLM = "zai-org/GLM-4.6"
GLM53 = "zai-org/GLM-5.3"
DEEPSEEK = "deepseek-ai/DeepSeek-V4-Flash"
BASELINE = "meta-llama/Llama-3.1-8B-Instruct"

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]
HI = {"role": "user", "content": "hi"}


def chat(model: str, *messages: Any, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": list(messages) or [dict(HI)], **fields}


def assert_rejected(body: dict[str, Any], rule: str, param: str) -> None:
    with pytest.raises(GatewayError) as info:
        validate_chat_completion(body)
    error = info.value
    assert error.status == 400
    assert error.code == 400
    assert error.error_type == "invalid_request_error"
    assert error.message.startswith(f"{rule}: "), error.message
    assert error.param == param


# --- detection ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "profile"),
    [
        ("moonshotai/Kimi-K2-Instruct", Profile.KIMI),
        ("kimi-latest", Profile.KIMI),
        ("Moonshot-v1-8k", Profile.KIMI),
        ("/models/kimi-k3", Profile.KIMI_K3),
        ("moonshotai/KIMI_K3-preview", Profile.KIMI_K3),
        ("MiniMaxAI/MiniMax-M2", Profile.MINIMAX),
        ("abab6.5s-chat", Profile.MINIMAX),
        ("zai-org/GLM-4.6", Profile.GLM),
        ("Z-AI/some-model", Profile.GLM),
        ("zai/glm-5", Profile.GLM),
        ("glm-5.3", Profile.GLM_5_3),
        ("zai-org/GLM5.3-Air", Profile.GLM_5_3),
        ("glm_5.3", Profile.GLM_5_3),
        ("glm-5-3", Profile.GLM_5_3),
        ("GLM5-3", Profile.GLM_5_3),
        ("deepseek-ai/DeepSeek-V4-Flash", Profile.DEEPSEEK_V4),
        ("deepseek-flash", Profile.DEEPSEEK_V4),
        ("deepseek-v4-pro", Profile.DEEPSEEK_V4),
        ("org/DEEPSEEK-V4.1-FLASH", Profile.DEEPSEEK_V4),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        ("deepseek-ai/DeepSeek-V3.1", None),
        ("deepseek-v4-flash-base", None),
        ("THUDM/chatglm3-6b", None),
        ("my-kimi", None),
        ("gpt-4o", None),
    ],
)
def test_it_detects_the_profile_from_the_model_name(model: str, profile: Profile | None) -> None:
    assert detect_profile(model) is profile


# --- role root ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [BASELINE, KIMI, K3, GLM, GLM53, DEEPSEEK])
def test_root_role_is_rejected_outside_minimax(model: str) -> None:
    body = chat(model, HI, {"role": "root", "content": "rules"})
    assert_rejected(body, "invalid_role", "messages[1].role")


def test_minimax_moves_root_messages_to_the_front_as_system() -> None:
    body = chat(
        MINIMAX,
        {"role": "system", "content": "s"},
        {"role": "root", "content": "r1"},
        HI,
        {"role": "root", "content": "r2"},
    )
    result = validate_chat_completion(body)
    assert result.modified is True
    assert [(m["role"], m["content"]) for m in result.body["messages"]] == [
        ("system", "r1"),
        ("system", "r2"),
        ("system", "s"),
        ("user", "hi"),
    ]


def test_minimax_without_root_is_not_modified() -> None:
    assert validate_chat_completion(chat(MINIMAX)).modified is False


# --- message-level tools ------------------------------------------------------------------------


def declaring(role: str, tools: Any, content: Any = "") -> dict[str, Any]:
    return {"role": role, "content": content, "tools": tools}


def fn(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize(
    "messages",
    [
        [declaring("system", [fn("get_weather")]), HI],
        [{"role": "system", "tools": [fn("get_weather")]}, HI],
        [declaring("developer", [fn("_a1"), fn("b" * 256)]), HI],
        [declaring("system", [], content="plain system prompt"), HI],
        [declaring("system", None, content="x"), HI],
        [declaring("system", [fn("a")]), declaring("developer", [fn("b")]), HI],
    ],
)
def test_kimi_accepts_message_tools(messages: list[Any]) -> None:
    result = validate_chat_completion(chat(KIMI, *messages))
    assert result.modified is False
    assert "tools" in result.body["messages"][0]


@pytest.mark.parametrize(
    ("messages", "fields", "rule", "param"),
    [
        ([HI, {"role": "user", "content": "x", "tools": []}], {}, "tools_role_restricted", "messages[1].tools"),
        ([HI, {"role": "assistant", "content": "x", "tools": [fn("a")]}], {}, "tools_role_restricted", "messages[1].tools"),
        ([declaring("system", {"name": "a"}), HI], {}, "tools_malformed", "messages[0].tools"),
        ([declaring("developer", "get_weather"), HI], {}, "tools_malformed", "messages[0].tools"),
        ([declaring("system", ["get_weather"]), HI], {}, "tools_malformed", "messages[0].tools"),
        ([declaring("system", [{"type": "function"}]), HI], {}, "tools_malformed", "messages[0].tools"),
        ([declaring("system", [fn("a")], content="x"), HI], {}, "tools_content_conflict", "messages[0].tools"),
        (
            [declaring("system", [fn("a")], content=[{"type": "text", "text": "x"}]), HI],
            {},
            "tools_content_conflict",
            "messages[0].tools",
        ),
        (
            [declaring("system", [{"type": "retrieval", "function": {"name": "a"}}]), HI],
            {},
            "tool_type_unsupported",
            "messages[0].tools[0].type",
        ),
        ([declaring("system", [fn("1abc")]), HI], {}, "tool_name_invalid", "messages[0].tools[0].function.name"),
        ([declaring("system", [fn("get-weather")]), HI], {}, "tool_name_invalid", "messages[0].tools[0].function.name"),
        ([declaring("system", [fn("")]), HI], {}, "tool_name_invalid", "messages[0].tools[0].function.name"),
        ([declaring("system", [fn("a" * 257)]), HI], {}, "tool_name_invalid", "messages[0].tools[0].function.name"),
        (
            [declaring("system", [fn("a"), fn("a")]), HI],
            {},
            "tool_name_duplicate",
            "messages[0].tools[1].function.name",
        ),
        (
            [declaring("system", [fn("a")]), declaring("developer", [fn("a")]), HI],
            {},
            "tool_name_duplicate",
            "messages[1].tools[0].function.name",
        ),
        (
            [declaring("system", [fn("get_weather")]), HI],
            {"tools": TOOLS},
            "tool_name_duplicate",
            "messages[0].tools[0].function.name",
        ),
    ],
)
def test_kimi_rejects_message_tools(
    messages: list[Any], fields: dict[str, Any], rule: str, param: str
) -> None:
    assert_rejected(chat(KIMI, *messages, **fields), rule, param)


def test_kimi_tool_choice_may_name_a_message_tool() -> None:
    body = chat(
        K3,
        declaring("system", [fn("lookup")]),
        HI,
        tool_choice={"type": "function", "function": {"name": "lookup"}},
    )
    assert validate_chat_completion(body).modified is False


@pytest.mark.parametrize("model", [BASELINE, MINIMAX, GLM, DEEPSEEK])
def test_other_profiles_drop_message_tools(model: str) -> None:
    body = chat(model, declaring("system", [fn("a")], content="x"), {**HI, "tools": "junk"})
    result = validate_chat_completion(body)
    assert result.modified is True
    assert all("tools" not in m for m in result.body["messages"])


def test_dropped_message_tools_do_not_satisfy_tool_choice() -> None:
    body = chat(BASELINE, declaring("system", [fn("a")]), HI, tool_choice="required")
    with pytest.raises(GatewayError, match="requires tools"):
        validate_chat_completion(body)


# --- Kimi K3 sampling and thinking --------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0},
        {"temperature": 0.6},
        {"temperature": 1},
        {"temperature": 1.0, "top_p": 0.95, "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1},
        {"thinking": {"type": "enabled", "effort": "low"}},
        {"thinking": {"effort": "high"}},
        {"thinking": {"type": "disabled", "effort": "max"}},
    ],
)
def test_kimi_k3_accepts_contract_values(fields: dict[str, Any]) -> None:
    validate_chat_completion(chat(K3, **fields))


@pytest.mark.parametrize(
    ("fields", "rule", "param"),
    [
        ({"temperature": 0.7}, "temperature_not_allowed", "temperature"),
        ({"temperature": 2}, "temperature_not_allowed", "temperature"),
        ({"top_p": 0.9}, "top_p_not_allowed", "top_p"),
        ({"top_p": 1}, "top_p_not_allowed", "top_p"),
        ({"presence_penalty": 0.1}, "presence_penalty_not_allowed", "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty_not_allowed", "frequency_penalty"),
        ({"n": 2}, "n_not_allowed", "n"),
        ({"thinking": {"type": "adaptive"}}, "thinking_type_not_supported", "thinking.type"),
        ({"thinking": {"effort": "medium"}}, "thinking_effort_invalid", "thinking.effort"),
        ({"thinking": {"type": "enabled", "effort": "xhigh"}}, "thinking_effort_invalid", "thinking.effort"),
    ],
)
def test_kimi_k3_rejects_values_outside_the_contract(fields: dict[str, Any], rule: str, param: str) -> None:
    assert_rejected(chat(K3, **fields), rule, param)


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0.7, "top_p": 0.5, "presence_penalty": 1, "frequency_penalty": 1, "n": 3},
        {"thinking": {"type": "adaptive", "effort": "medium"}},
    ],
)
def test_other_kimi_models_keep_the_baseline_ranges(fields: dict[str, Any]) -> None:
    validate_chat_completion(chat(KIMI, **fields))


# --- Kimi stream usage default ------------------------------------------------------------------


@pytest.mark.parametrize("model", [KIMI, K3])
def test_kimi_turns_include_usage_on_for_streams(model: str) -> None:
    result = validate_chat_completion(chat(model, stream=True))
    assert result.modified is True
    assert result.body["stream_options"] == {"include_usage": True}


def test_kimi_fills_include_usage_into_existing_stream_options() -> None:
    result = validate_chat_completion(chat(KIMI, stream=True, stream_options={"continuous_usage_stats": True}))
    assert result.modified is True
    assert result.body["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


def test_kimi_keeps_an_explicit_include_usage_false() -> None:
    result = validate_chat_completion(chat(KIMI, stream=True, stream_options={"include_usage": False}))
    assert result.modified is False
    assert result.body["stream_options"] == {"include_usage": False}


@pytest.mark.parametrize(("model", "stream"), [(KIMI, False), (BASELINE, True)])
def test_include_usage_is_left_alone_without_kimi_streaming(model: str, stream: bool) -> None:
    result = validate_chat_completion(chat(model, stream=stream))
    assert result.modified is False
    assert "stream_options" not in result.body


# --- thinking type per profile ------------------------------------------------------------------


@pytest.mark.parametrize("model", [GLM, GLM53, DEEPSEEK])
def test_adaptive_thinking_is_rejected(model: str) -> None:
    assert_rejected(chat(model, thinking={"type": "adaptive"}), "thinking_type_not_supported", "thinking.type")


@pytest.mark.parametrize("model", [BASELINE, KIMI, MINIMAX])
def test_adaptive_thinking_is_accepted(model: str) -> None:
    validate_chat_completion(chat(model, thinking={"type": "adaptive"}))


def test_glm_5_3_cannot_turn_thinking_off() -> None:
    assert_rejected(chat(GLM53, thinking={"type": "disabled"}), "thinking_disabled_not_supported", "thinking.type")


@pytest.mark.parametrize("model", [GLM, BASELINE, DEEPSEEK])
def test_other_models_may_turn_thinking_off(model: str) -> None:
    validate_chat_completion(chat(model, thinking={"type": "disabled"}))


# --- MiniMax tool-call history ------------------------------------------------------------------


def calls(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids],
    }


def answer(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def test_minimax_accepts_a_well_formed_tool_history() -> None:
    body = chat(MINIMAX, HI, calls("c1", "c2"), answer("c2"), answer("c1"), calls("c3"), answer("c3"))
    assert validate_chat_completion(body).modified is False


@pytest.mark.parametrize(
    ("messages", "rule", "param"),
    [
        ([HI, calls("c1", "c1"), answer("c1")], "tool_call_id_duplicate", "messages[1].tool_calls"),
        (
            [HI, calls("c1"), answer("c1"), calls("c1"), answer("c1")],
            "tool_call_id_duplicate",
            "messages[3].tool_calls",
        ),
        ([HI, calls("c1"), answer("c2")], "tool_call_id_mismatch", "messages[2].tool_call_id"),
        ([HI, answer("c1")], "tool_call_id_mismatch", "messages[1].tool_call_id"),
        ([HI, calls("c1"), answer("c1"), answer("c1")], "tool_call_id_mismatch", "messages[3].tool_call_id"),
    ],
)
def test_minimax_rejects_inconsistent_tool_call_ids(messages: list[Any], rule: str, param: str) -> None:
    assert_rejected(chat(MINIMAX, *messages), rule, param)


@pytest.mark.parametrize("model", [BASELINE, KIMI])
def test_other_profiles_tolerate_loose_tool_history(model: str) -> None:
    validate_chat_completion(chat(model, HI, calls("c1", "c1"), answer("c9"), answer("c9")))


# --- DeepSeek V4 forced tool_choice with thinking -----------------------------------------------

FORCED = [
    "required",
    {"type": "function", "function": {"name": "get_weather"}},
    {"type": "allowed_tools", "mode": "required", "tools": [fn("get_weather")]},
    {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [fn("get_weather")]}},
]


@pytest.mark.parametrize("tool_choice", FORCED)
@pytest.mark.parametrize(
    "thinking",
    [
        {},
        {"thinking": {"type": "enabled"}},
        {"reasoning_effort": "high"},
        {"reasoning_effort": "minimal"},
        {"thinking": {"type": "disabled", "effort": "high"}},
        {"chat_template_kwargs": {"thinking": True}, "thinking": {"type": "disabled"}},
    ],
)
def test_deepseek_rejects_forced_tool_choice_while_thinking(tool_choice: Any, thinking: dict[str, Any]) -> None:
    body = chat(DEEPSEEK, tools=TOOLS, tool_choice=tool_choice, **thinking)
    assert_rejected(body, "tool_choice_not_supported", "tool_choice")


@pytest.mark.parametrize("tool_choice", FORCED)
@pytest.mark.parametrize(
    "thinking_off",
    [
        {"thinking": {"type": "disabled"}},
        {"reasoning_effort": "none"},
        {"thinking": {"effort": "none"}},
        {"chat_template_kwargs": {"thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": False}, "thinking": {"type": "enabled"}},
        {"chat_template_kwargs": {"reasoning_effort": "none"}, "reasoning_effort": "high"},
    ],
)
def test_deepseek_accepts_forced_tool_choice_without_thinking(tool_choice: Any, thinking_off: dict[str, Any]) -> None:
    validate_chat_completion(chat(DEEPSEEK, tools=TOOLS, tool_choice=tool_choice, **thinking_off))


@pytest.mark.parametrize(
    "tool_choice", ["auto", "none", {"type": "allowed_tools", "mode": "auto", "tools": [fn("get_weather")]}]
)
def test_deepseek_accepts_unforced_tool_choice_while_thinking(tool_choice: Any) -> None:
    validate_chat_completion(chat(DEEPSEEK, tools=TOOLS, tool_choice=tool_choice, thinking={"type": "enabled"}))


@pytest.mark.parametrize("model", [BASELINE, KIMI, GLM])
def test_other_profiles_accept_forced_tool_choice_while_thinking(model: str) -> None:
    validate_chat_completion(chat(model, tools=TOOLS, tool_choice="required", thinking={"type": "enabled"}))
