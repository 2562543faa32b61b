"""POST /v1/chat/completions request validation (spec 1, Chat completion request). Pure functions."""

from __future__ import annotations

import math
from typing import Any

import pytest

from inference.errors import GatewayError
from inference.schemas.chat import validate_chat_completion

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time"}},
]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def with_messages(*messages: Any, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": list(messages), **fields}


def assert_rejected(body: Any, param: str | None, fragment: str) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        validate_chat_completion(body)
    error = info.value
    assert error.status == 400
    assert error.code == 400
    assert error.error_type == "invalid_request_error"
    assert error.param == param
    assert fragment in error.message, error.message
    if param is not None:
        assert param.split("[")[0].split(".")[0] in error.message
    return error


# --- accepted boundaries ------------------------------------------------------------------------

ACCEPTED: list[tuple[str, Any]] = [
    ("temperature", 0),
    ("temperature", 2),
    ("temperature", 0.95),
    ("top_p", 1),
    ("top_p", 1e-9),
    ("n", 1),
    ("n", 10),
    ("max_completion_tokens", 1),
    ("stream", True),
    ("stream", False),
    ("stop", "END"),
    ("stop", []),
    ("stop", ["a", "b", "c", "d"]),
    ("presence_penalty", -2),
    ("presence_penalty", 2),
    ("frequency_penalty", -2),
    ("frequency_penalty", 2.0),
    ("logprobs", False),
    ("logit_bias", {}),
    ("logit_bias", {"50256": -100, "11": 0.5}),
    ("tools", []),
    ("tools", TOOLS),
    ("tools", [{"type": "custom", "custom": {"name": "grammar"}}]),
    ("parallel_tool_calls", False),
    ("tool_choice", "none"),
    ("tool_choice", "auto"),
    ("response_format", {"type": "text"}),
    ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    (
        "response_format",
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}},
    ),
    ("reasoning_effort", "high"),
    ("thinking", {}),
    ("thinking", {"type": "enabled", "effort": "high", "keep": "all", "clear_thinking": False}),
    ("thinking", {"type": "disabled"}),
    ("thinking", {"type": "adaptive", "budget_tokens": 1024}),
    ("user", "user-1"),
    ("top_k", -1),
    ("top_k", 1),
    ("min_p", 0),
    ("min_p", 1),
    ("min_tokens", 0),
    ("repetition_penalty", 0),
    ("repetition_penalty", 2),
    ("regex", "[a-z]+"),
    ("ebnf", 'root ::= "a"'),
    ("stop_token_ids", []),
    ("stop_token_ids", [1, 2]),
    ("ignore_eos", True),
    ("no_stop_trim", True),
    ("skip_special_tokens", False),
    ("continue_final_message", True),
    ("separate_reasoning", False),
    ("stream_reasoning", False),
    ("return_hidden_states", True),
    ("chat_template_kwargs", {"enable_thinking": False}),
    ("lora_path", "adapters/a"),
    ("sampling_seed", -7),
    ("rid", "req-1"),
    ("temperature", None),
    ("tools", None),
    ("tool_choice", None),
    ("stream_options", None),
]


@pytest.mark.parametrize(("field", "value"), ACCEPTED)
def test_it_accepts_field_values(field: str, value: Any) -> None:
    body = chat(**{field: value})
    result = validate_chat_completion(body)
    assert result.body is body
    assert result.body[field] == value
    assert result.modified is False


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": True, "top_logprobs": 0},
        {"logprobs": True, "top_logprobs": 20},
        {"stream": True, "stream_options": {}},
        {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": False}},
        {"stream": True, "stream_options": {"include_usage": False, "vendor_flag": "x"}},
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        {
            "tools": TOOLS,
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "function": {"name": "get_weather"}}],
            },
        },
        {
            "tools": TOOLS,
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "get_time"}}]},
            },
        },
        {"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"name": "get_time"}]}},
        {"max_completion_tokens": 5, "min_tokens": 5},
        {"max_tokens": 5, "min_tokens": 5},
        {"regex": "a", "response_format": {"type": "text"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    ],
)
def test_it_accepts_valid_field_combinations(fields: dict[str, Any]) -> None:
    validate_chat_completion(chat(**fields))


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system"}, {"role": "user", "content": "hi"}],
        [{"role": "system", "content": None}, {"role": "user", "content": "hi"}],
        [{"role": "developer", "content": ""}, {"role": "user", "content": [{"type": "text", "text": "x"}]}],
        [{"role": "user", "content": [{"type": "hologram", "beam": 3}]}],
        [{"role": "user", "content": [{"type": "image_url"}]}],
        [{"role": "user", "content": [{}]}],
        [
            {"role": "user", "content": "hi", "name": "alice"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                "reasoning_content": "thinking",
            },
            {"role": "tool", "tool_call_id": "c1", "content": ""},
            {"role": "assistant", "reasoning": "more", "content": "done"},
        ],
        [{"role": "assistant"}],
        [{"role": "function", "name": "f", "content": "{}"}],
        [{"role": "user", "content": "hi", "x_vendor": {"keep": True}}],
    ],
)
def test_it_accepts_messages(messages: list[Any]) -> None:
    validate_chat_completion(with_messages(*messages))


# --- rejected values ----------------------------------------------------------------------------

REJECTED: list[tuple[dict[str, Any], str, str]] = [
    ({"temperature": -0.1}, "temperature", "between 0 and 2"),
    ({"temperature": 2.1}, "temperature", "between 0 and 2"),
    ({"temperature": "1"}, "temperature", "must be a number"),
    ({"temperature": True}, "temperature", "must be a number"),
    ({"temperature": math.nan}, "temperature", "between 0 and 2"),
    ({"top_p": 0}, "top_p", "greater than 0 and at most 1"),
    ({"top_p": 1.01}, "top_p", "greater than 0 and at most 1"),
    ({"n": 0}, "n", "between 1 and 10"),
    ({"n": 11}, "n", "between 1 and 10"),
    ({"n": 2.0}, "n", "must be an integer"),
    ({"n": True}, "n", "must be an integer"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
    ({"max_completion_tokens": 5.0}, "max_completion_tokens", "must be an integer"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"max_tokens": "5"}, "max_tokens", "must be an integer"),
    ({"stream": "true"}, "stream", "must be a boolean"),
    ({"stream": 1}, "stream", "must be a boolean"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream is true"),
    ({"stream": False, "stream_options": {}}, "stream_options", "only allowed when stream is true"),
    ({"stream": True, "stream_options": []}, "stream_options", "must be an object"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "boolean"),
    (
        {"stream": True, "stream_options": {"continuous_usage_stats": 1}},
        "stream_options.continuous_usage_stats",
        "boolean",
    ),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": ""}, "stop", "must not be an empty string"),
    ({"stop": ["a", ""]}, "stop", "non-empty strings"),
    ({"stop": [1]}, "stop", "non-empty strings"),
    ({"stop": 5}, "stop", "string or an array"),
    ({"presence_penalty": -2.1}, "presence_penalty", "between -2 and 2"),
    ({"presence_penalty": 2.01}, "presence_penalty", "between -2 and 2"),
    ({"frequency_penalty": -2.5}, "frequency_penalty", "between -2 and 2"),
    ({"frequency_penalty": 3}, "frequency_penalty", "between -2 and 2"),
    ({"logprobs": 1}, "logprobs", "must be a boolean"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "between 0 and 20"),
    ({"top_logprobs": 5}, "top_logprobs", "requires logprobs"),
    ({"logprobs": False, "top_logprobs": 5}, "top_logprobs", "requires logprobs"),
    ({"logit_bias": []}, "logit_bias", "must be an object"),
    ({"logit_bias": {"1": "x"}}, "logit_bias", "must be numbers"),
    ({"logit_bias": {"1": True}}, "logit_bias", "must be numbers"),
    ({"tools": {}}, "tools", "must be an array"),
    ({"tools": [1]}, "tools[0]", "must be an object"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "must be a string"),
    ({"tools": [{"type": "function"}]}, "tools[0].function.name", "must be a string"),
    ({"tools": [{"function": {"name": 3}}]}, "tools[0].function.name", "must be a string"),
    ({"tool_choice": "any"}, "tool_choice", "none, auto, required"),
    ({"tool_choice": 1}, "tool_choice", "string or an object"),
    ({"tool_choice": "required"}, "tool_choice", "requires tools"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice", "requires tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "requires tools"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
        "does not match any tool",
    ),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": 1}}},
        "tool_choice.function.name",
        "must be a string",
    ),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function", "must be an object"),
    ({"tools": TOOLS, "tool_choice": {"type": "custom"}}, "tool_choice.type", "function or allowed_tools"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "any", "tools": [{"name": "get_time"}]}},
        "tool_choice.mode",
        "auto or required",
    ),
    (
        {"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
        "tool_choice.tools",
        "non-empty array",
    ),
    (
        {"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"name": "nope"}]}},
        "tool_choice.tools[0].function.name",
        "does not match any tool",
    ),
    (
        {
            "tools": TOOLS,
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "x"}}]},
            },
        },
        "tool_choice.allowed_tools.tools[0].function.name",
        "does not match any tool",
    ),
    (
        {"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": []}},
        "tool_choice.allowed_tools",
        "must be an object",
    ),
    (
        {"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"name": "get_time"}]}},
        "tool_choice",
        "requires tools",
    ),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be a boolean"),
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {}}, "response_format.type", "text, json_object, json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "text, json_object, json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "must be an object"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format.json_schema.name",
        "non-empty string",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "", "schema": {}}}},
        "response_format.json_schema.name",
        "non-empty string",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
        "must be a JSON object",
    ),
    *[
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
            "response_format.json_schema.schema",
            "must be a JSON object",
        )
        for schema in ([], "object", True, 1, None)
    ],
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}},
        "response_format.json_schema.strict",
        "must be a boolean",
    ),
    ({"reasoning_effort": True}, "reasoning_effort", "string or a number"),
    ({"reasoning_effort": ["high"]}, "reasoning_effort", "string or a number"),
    ({"reasoning_effort": math.inf}, "reasoning_effort", "finite"),
    ({"thinking": "on"}, "thinking", "must be an object"),
    ({"thinking": {"type": "auto"}}, "thinking.type", "enabled, disabled, adaptive"),
    ({"thinking": {"type": 1}}, "thinking.type", "enabled, disabled, adaptive"),
    ({"thinking": {"effort": 3}}, "thinking.effort", "must be a string"),
    ({"thinking": {"keep": True}}, "thinking.keep", "must be a string"),
    ({"thinking": {"clear_thinking": "no"}}, "thinking.clear_thinking", "must be a boolean"),
    ({"user": 42}, "user", "must be a string"),
    # extension fields
    ({"top_k": 0}, "top_k", "-1 or at least 1"),
    ({"top_k": -2}, "top_k", "-1 or at least 1"),
    ({"top_k": 5.0}, "top_k", "must be an integer"),
    ({"min_p": -0.1}, "min_p", "between 0 and 1"),
    ({"min_p": 1.1}, "min_p", "between 0 and 1"),
    ({"min_tokens": -1}, "min_tokens", "at least 0"),
    ({"min_tokens": 1.0}, "min_tokens", "must be an integer"),
    ({"max_completion_tokens": 4, "min_tokens": 5}, "min_tokens", "must not exceed max_completion_tokens"),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", "must not exceed max_completion_tokens"),
    ({"repetition_penalty": -0.1}, "repetition_penalty", "between 0 and 2"),
    ({"repetition_penalty": 2.1}, "repetition_penalty", "between 0 and 2"),
    ({"regex": 1}, "regex", "must be a string"),
    ({"ebnf": ["a"]}, "ebnf", "must be a string"),
    ({"regex": "a", "ebnf": "b"}, "ebnf", "only one of regex and ebnf"),
    (
        {"regex": "a", "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
        "regex",
        "cannot be combined with a json_schema response_format",
    ),
    ({"regex": "a", "response_format": {"type": "json_object"}}, "regex", "json_object response_format"),
    ({"ebnf": "a", "response_format": {"type": "json_object"}}, "ebnf", "json_object response_format"),
    ({"stop_token_ids": [1.0]}, "stop_token_ids", "array of integers"),
    ({"stop_token_ids": "1"}, "stop_token_ids", "array of integers"),
    ({"stop_token_ids": [True]}, "stop_token_ids", "array of integers"),
    *[
        ({field: "true"}, field, "must be a boolean")
        for field in (
            "ignore_eos",
            "no_stop_trim",
            "skip_special_tokens",
            "continue_final_message",
            "separate_reasoning",
            "stream_reasoning",
            "return_hidden_states",
        )
    ],
    ({"chat_template_kwargs": []}, "chat_template_kwargs", "must be an object"),
    ({"lora_path": 1}, "lora_path", "must be a string"),
    ({"sampling_seed": 1.5}, "sampling_seed", "must be an integer"),
    ({"rid": 7}, "rid", "must be a string"),
]


@pytest.mark.parametrize(("fields", "param", "fragment"), REJECTED)
def test_it_rejects_field_values(fields: dict[str, Any], param: str, fragment: str) -> None:
    assert_rejected(chat(**fields), param, fragment)


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model", "model is required"),
        ({"model": "", "messages": [{"role": "user", "content": "hi"}]}, "model", "non-empty string"),
        ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model", "non-empty string"),
        ({"model": MODEL}, "messages", "messages is required"),
        ({"model": MODEL, "messages": []}, "messages", "must not be empty"),
        ({"model": MODEL, "messages": {"role": "user"}}, "messages", "must be an array"),
    ],
)
def test_it_rejects_missing_or_malformed_model_and_messages(body: dict[str, Any], param: str, fragment: str) -> None:
    assert_rejected(body, param, fragment)


def test_it_rejects_a_body_that_is_not_an_object() -> None:
    assert_rejected([], None, "must be a JSON object")


@pytest.mark.parametrize(
    ("messages", "param", "fragment"),
    [
        (["hi"], "messages[0]", "must be an object"),
        ([{"content": "hi"}], "messages[0].role", "invalid_role"),
        ([{"role": "bot", "content": "hi"}], "messages[0].role", "invalid_role"),
        ([{"role": ["user"], "content": "hi"}], "messages[0].role", "invalid_role"),
        ([{"role": "user", "content": "hi"}, {"role": "root", "content": "x"}], "messages[1].role", "invalid_role"),
        ([{"role": "user"}], "messages[0].content", "is required"),
        ([{"role": "user", "content": None}], "messages[0].content", "is required"),
        ([{"role": "developer"}], "messages[0].content", "is required"),
        ([{"role": "tool", "tool_call_id": "c1"}], "messages[0].content", "is required"),
        ([{"role": "user", "content": 5}], "messages[0].content", "string or an array"),
        ([{"role": "system", "content": {"text": "x"}}], "messages[0].content", "string or an array"),
        ([{"role": "user", "content": ""}], "messages[0].content", "must not be empty"),
        ([{"role": "user", "content": []}], "messages[0].content", "must not be empty"),
        ([{"role": "user", "content": "hi", "name": 1}], "messages[0].name", "must be a string"),
        ([{"role": "assistant", "tool_calls": {}}], "messages[0].tool_calls", "must be an array"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id", "required for role tool"),
        ([{"role": "tool", "content": "x", "tool_call_id": 3}], "messages[0].tool_call_id", "must be a string"),
        ([{"role": "assistant", "reasoning_content": 1}], "messages[0].reasoning_content", "must be a string"),
        ([{"role": "assistant", "reasoning": ["x"]}], "messages[0].reasoning", "must be a string"),
    ],
)
def test_it_rejects_messages(messages: list[Any], param: str, fragment: str) -> None:
    assert_rejected(with_messages(*messages), param, fragment)


# --- rewrites and the returned request ----------------------------------------------------------


def test_a_plain_request_is_not_modified() -> None:
    body = chat(temperature=1, top_p=0.95, stream=True, unknown_field={"a": [1, 2]})
    result = validate_chat_completion(body)
    assert result.modified is False
    assert result.model == MODEL
    assert result.stream is True
    assert body["unknown_field"] == {"a": [1, 2]}
    assert type(body["temperature"]) is int


def test_stream_defaults_to_false() -> None:
    assert validate_chat_completion(chat()).stream is False


def test_max_tokens_moves_into_max_completion_tokens() -> None:
    result = validate_chat_completion(chat(max_tokens=64))
    assert result.modified is True
    assert "max_tokens" not in result.body
    assert result.body["max_completion_tokens"] == 64


def test_max_tokens_moves_when_max_completion_tokens_is_null() -> None:
    result = validate_chat_completion(chat(max_completion_tokens=None, max_tokens=64))
    assert result.modified is True
    assert result.body["max_completion_tokens"] == 64
    assert "max_tokens" not in result.body


def test_max_tokens_is_kept_when_max_completion_tokens_is_set() -> None:
    result = validate_chat_completion(chat(max_completion_tokens=32, max_tokens=64))
    assert result.modified is False
    assert result.body["max_completion_tokens"] == 32
    assert result.body["max_tokens"] == 64


@pytest.mark.parametrize(
    ("effort", "expected"),
    [(1, "1"), (0, "0"), (0.5, "0.5"), (2.0, "2.0"), (-3, "-3"), (1e20, "100000000000000000000")],
)
def test_numeric_reasoning_effort_becomes_its_decimal_string(effort: float, expected: str) -> None:
    result = validate_chat_completion(chat(reasoning_effort=effort))
    assert result.body["reasoning_effort"] == expected
    assert result.modified is True


def test_string_reasoning_effort_is_kept() -> None:
    result = validate_chat_completion(chat(reasoning_effort="medium"))
    assert result.body["reasoning_effort"] == "medium"
    assert result.modified is False


def test_content_parts_are_forwarded_unchanged() -> None:
    parts = [{"type": "image_url", "image_url": {"url": "x", "max_long_side_pixel": 7}}, {"type": "new"}]
    body = with_messages({"role": "user", "content": parts})
    result = validate_chat_completion(body)
    assert result.body["messages"][0]["content"] is parts
    assert result.modified is False
