"""POST /v1/messages and /v1/messages/count_tokens request validation (spec 1, "Messages-style API",
"Token counting", "Errors": Messages API error sources). Pure functions.

A field missing or of the wrong JSON type is 400 json_parse_error (param null); a rule violation is 400
with the numeric code 400 and param naming the field.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from anthropic.types import (
    Base64ImageSourceParam,
    Base64PDFSourceParam,
    DocumentBlockParam,
    ImageBlockParam,
    MessageParam,
    MetadataParam,
    PlainTextSourceParam,
    RedactedThinkingBlockParam,
    SearchResultBlockParam,
    ServerToolUseBlockParam,
    TextBlockParam,
    ThinkingBlockParam,
    ThinkingConfigAdaptiveParam,
    ThinkingConfigBetweenToolsParam,
    ThinkingConfigEnabledParam,
    ToolBash20250124Param,
    ToolChoiceToolParam,
    ToolParam,
    ToolReferenceBlockParam,
    ToolResultBlockParam,
    ToolSearchToolResultBlockParam,
    ToolSearchToolSearchResultBlockParam,
    ToolUseBlockParam,
    URLImageSourceParam,
    WebSearchResultBlockParam,
    WebSearchToolResultBlockParam,
)
from anthropic.types.message_count_tokens_params import MessageCountTokensParams
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.errors import GatewayError
from inference.schemas.base import ValidatedRequest
from inference.schemas.messages import (
    ACCEPTED_BLOCK_TYPES,
    CustomTool,
    MessagesRequest,
    Thinking,
    ToolChoice,
    validate_count_tokens,
    validate_messages,
)
from tests.inference.schemas.test_fuzz import JSON

MODEL = "Qwen/Qwen3-8B"
WEATHER = {"name": "get_weather", "description": "Weather at a place", "input_schema": {"type": "object"}}
BASH = {"type": "bash_20250124", "name": "bash"}
TOOLSET = {"type": "mcp_toolset", "mcp_server_name": "docs"}
SERVERS = [{"type": "url", "name": "docs", "url": "https://mcp.example.com/mcp"}]

Validator = Callable[[Any], ValidatedRequest]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}


def user(*blocks: Any) -> dict[str, Any]:
    """A body whose only message is a user turn with these content blocks."""
    return body(messages=[{"role": "user", "content": list(blocks)}])


def count_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def assert_parse_error(request: Any, field: str, validate: Validator = validate_messages) -> None:
    with pytest.raises(GatewayError) as info:
        validate(request)
    error = info.value
    assert (error.status, error.code, error.error_type, error.param) == (
        400, "json_parse_error", "invalid_request_error", None,
    ), error.to_dict()
    assert field in error.message, error.message


def assert_rule(request: Any, param: str, fragment: str, validate: Validator = validate_messages) -> None:
    with pytest.raises(GatewayError) as info:
        validate(request)
    error = info.value
    assert (error.status, error.code, error.error_type, error.param) == (
        400, 400, "invalid_request_error", param,
    ), error.to_dict()
    assert fragment in error.message, error.message


def accepted(request: dict[str, Any], validate: Validator = validate_messages) -> MessagesRequest:
    sent = copy.deepcopy(request)
    checked = validate(request)
    assert checked.body == sent and checked.body is request and checked.modified is False
    assert isinstance(checked.parsed, MessagesRequest)
    return checked.parsed


# --- missing or wrongly typed: json_parse_error ---------------------------------------------------------

IMAGE = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}

PARSE_ERRORS: list[tuple[Any, str]] = [
    ([body()], "JSON object"),
    ("hello", "JSON object"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    (body(model=None), "model"),
    (body(model=7), "model"),
    (body(model=["a"]), "model"),
    ({"model": MODEL, "max_tokens": 8}, "messages"),
    (body(messages="hi"), "messages"),
    (body(messages={"role": "user"}), "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    (body(max_tokens=None), "max_tokens"),
    (body(max_tokens="64"), "max_tokens"),
    (body(max_tokens=64.0), "max_tokens"),
    (body(max_tokens=True), "max_tokens"),
    (body(messages=["hi"]), "messages[0]"),
    (body(messages=[{"content": "hi"}]), "messages[0].role"),
    (body(messages=[{"role": 1, "content": "hi"}]), "messages[0].role"),
    (body(messages=[{"role": "user"}]), "messages[0].content"),
    (body(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (body(messages=[{"role": "user", "content": {"type": "text", "text": "hi"}}]), "messages[0].content"),
    (user("hi"), "messages[0].content[0]"),
    (user({"text": "hi"}), "messages[0].content[0].type"),
    (user({"type": 3, "text": "hi"}), "messages[0].content[0].type"),
    (user({"type": "text"}), "messages[0].content[0].text"),
    (user({"type": "text", "text": ["hi"]}), "messages[0].content[0].text"),
    (user({"type": "image", "source": "https://example.com/a.png"}), "messages[0].content[0].source"),
    (user({"type": "document"}), "messages[0].content[0].source"),
    (user({"type": "tool_use", "name": "f", "input": {}}), "messages[0].content[0].id"),
    (user({"type": "tool_use", "id": "t", "name": "f", "input": "{}"}), "messages[0].content[0].input"),
    (user({"type": "tool_result", "tool_use_id": 1}), "messages[0].content[0].tool_use_id"),
    (user({"type": "tool_result", "tool_use_id": "t", "content": 5}), "messages[0].content[0].content"),
    (user({"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}), "messages[0].content[0].is_error"),
    (user({"type": "tool_result", "tool_use_id": "t", "content": ["ok"]}), "messages[0].content[0].content[0]"),
    (user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]}),
     "messages[0].content[0].content[0].text"),
    (user({"type": "thinking", "thinking": "hmm"}), "messages[0].content[0].signature"),
    (user({"type": "redacted_thinking", "data": 1}), "messages[0].content[0].data"),
    (user({"type": "server_tool_use", "id": "s", "name": "web_search"}), "messages[0].content[0].input"),
    (user({"type": "search_result", "source": "s", "content": []}), "messages[0].content[0].title"),
    (user({"type": "search_result", "source": "s", "title": "t", "content": "x"}), "messages[0].content[0].content"),
    (user({"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": 1}]}),
     "messages[0].content[0].content[0].text"),
    (user({"type": "web_search_tool_result", "tool_use_id": "s", "content": "x"}), "messages[0].content[0].content"),
    (user({"type": "tool_search_tool_result", "tool_use_id": "s", "content": []}), "messages[0].content[0].content"),
    (user({"type": "tool_reference"}), "messages[0].content[0].tool_name"),
    (body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": [IMAGE, 5]}]),
     "messages[1].content[1]"),
    (body(stream="yes"), "stream"),
    (body(temperature="0.5"), "temperature"),
    (body(temperature=True), "temperature"),
    (body(top_p=[1]), "top_p"),
    (body(top_k=1.5), "top_k"),
    (body(top_k="5"), "top_k"),
    (body(metadata=["u"]), "metadata"),
    (body(metadata={"user_id": 5}), "metadata.user_id"),
    (body(container=5), "container"),
    (body(mcp_servers={"name": "docs"}), "mcp_servers"),
    (body(rid=5), "rid"),
    (body(system=5), "system"),
    (body(system=["be brief"]), "system[0]"),
    (body(system=[{"text": "be brief"}]), "system[0].type"),
    (body(system=[{"type": "text", "text": 5}]), "system[0].text"),
    (body(tools={"name": "f"}), "tools"),
    (body(tools=["get_weather"]), "tools[0]"),
    (body(tools=[{"type": 5, "name": "f"}]), "tools[0].type"),
    (body(tools=[{**WEATHER, "description": 5}]), "tools[0].description"),
    (body(tools=[WEATHER], tool_choice="auto"), "tool_choice"),
    (body(tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": "yes"}),
     "tool_choice.disable_parallel_tool_use"),
    (body(thinking="enabled"), "thinking"),
    (body(thinking=True), "thinking"),
]  # fmt: skip


@pytest.mark.parametrize(("request_body", "field"), PARSE_ERRORS)
def test_missing_or_wrongly_typed_fields_are_json_parse_errors(request_body: Any, field: str) -> None:
    assert_parse_error(request_body, field)


# --- rule violations: numeric code 400 with param -------------------------------------------------------

RULES: list[tuple[dict[str, Any], str, str]] = [
    (body(max_tokens=0), "max_tokens", "at least 1"),
    (body(max_tokens=-5), "max_tokens", "at least 1"),
    (body(model=""), "model", "empty"),
    (body(messages=[]), "messages", "empty"),
    (body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role", "user, assistant, system"),
    (body(messages=[{"role": "user", "content": "hi"}, {"role": "developer", "content": "x"}]),
     "messages[1].role", "user, assistant, system"),
    (user({"type": "video", "source": {}}), "messages[0].content[0].type", "'video' is not accepted"),
    (user({"type": "input_text", "text": "hi"}), "messages[0].content[0].type", "is not accepted"),
    (user({"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "f", "server_name": "s", "input": {}}),
     "messages[0].content[0].type", "mcp_tool_use blocks are not accepted"),
    (user({"type": "text", "text": "hi"}, {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": []}),
     "messages[0].content[1].type", "mcp_tool_result blocks are not accepted"),
    (user({"type": "tool_result", "tool_use_id": "t",
           "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}),
     "messages[0].content[0].content[0].type", "'tool_use' is not accepted"),
    (user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "mcp_tool_result"}]}),
     "messages[0].content[0].content[0].type", "mcp_tool_result blocks are not accepted"),
    (user({"type": "search_result", "source": "s", "title": "t", "content": [IMAGE]}),
     "messages[0].content[0].content[0].type", "'image' is not accepted"),
    (body(system=[{"type": "image", "source": {}}]), "system[0].type", "must be text"),
    (body(tool_choice={"type": "auto"}), "tool_choice", "requires tools"),
    (body(tools=[], tool_choice={"type": "any"}), "tool_choice", "requires tools"),
    (body(tool_choice={"type": "tool", "name": "get_weather"}), "tool_choice", "requires tools"),
    (body(tools=[WEATHER], tool_choice={"type": "tool"}), "tool_choice.name", "required"),
    (body(tools=[WEATHER], tool_choice={"type": "tool", "name": 5}), "tool_choice.name", "required"),
    (body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_time"}), "tool_choice.name",
     "'get_time' does not name a custom tool"),
    (body(tools=[WEATHER, BASH], tool_choice={"type": "tool", "name": "bash"}), "tool_choice.name",
     "'bash' does not name a custom tool"),
    (body(tools=[WEATHER], tool_choice={"type": "required"}), "tool_choice.type", "auto, any, tool, none"),
    (body(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}), "tool_choice.type", "auto"),
    (body(tools=[WEATHER], tool_choice={}), "tool_choice.type", "auto, any, tool, none"),
    (body(tool_choice={"type": ["none"]}), "tool_choice.type", "auto, any, tool, none"),
    (body(thinking={"type": "enabled"}), "thinking.budget_tokens", "at least 1"),
    (body(thinking={"type": "enabled", "budget_tokens": 0}), "thinking.budget_tokens", "at least 1"),
    (body(thinking={"type": "enabled", "budget_tokens": "1024"}), "thinking.budget_tokens", "integer"),
    (body(thinking={"type": "enabled", "budget_tokens": 1024.0}), "thinking.budget_tokens", "integer"),
    (body(thinking={"type": "adaptive", "budget_tokens": 1024}), "thinking.budget_tokens", "only"),
    (body(thinking={"type": "disabled", "budget_tokens": 1024}), "thinking.budget_tokens", "only"),
    (body(thinking={"type": "enabled", "budget_tokens": 1024, "display": "full"}), "thinking.display",
     "summarized or omitted"),
    (body(thinking={"type": "adaptive", "display": 1}), "thinking.display", "summarized or omitted"),
    (body(thinking={"type": "disabled", "display": "omitted"}), "thinking.display", "enabled or adaptive"),
    (body(thinking={"type": "between_tools"}), "thinking.type", "enabled, adaptive, disabled"),
    (body(thinking={"budget_tokens": 1024}), "thinking.type", "enabled, adaptive, disabled"),
    (body(thinking={"type": {"enabled": True}}), "thinking.type", "enabled, adaptive, disabled"),
    (body(service_tier="priority"), "service_tier", "auto or standard_only"),
    (body(service_tier=1), "service_tier", "auto or standard_only"),
    (body(stop_sequences="END"), "stop_sequences", "array of strings"),
    (body(stop_sequences=["END", 1]), "stop_sequences", "array of strings"),
    (body(stop_sequences={"a": "b"}), "stop_sequences", "array of strings"),
    (body(tools=[WEATHER, TOOLSET]), "mcp_servers", "mcp_toolset"),
    (body(tools=[TOOLSET], mcp_servers=[]), "mcp_servers", "mcp_toolset"),
    (body(tools=[{"input_schema": {"type": "object"}}]), "tools[0].name", "string"),
    (body(tools=[WEATHER, {"type": "custom", "name": 5, "input_schema": {}}]), "tools[1].name", "string"),
    (body(tools=[{"name": "f"}]), "tools[0].input_schema", "JSON Schema object"),
    (body(tools=[{"type": "custom", "name": "f", "input_schema": "object"}]), "tools[0].input_schema", "object"),
    (body(tools=[{"name": "f", "input_schema": [{"type": "object"}]}]), "tools[0].input_schema", "object"),
]  # fmt: skip


@pytest.mark.parametrize(("request_body", "param", "fragment"), RULES)
def test_rule_violations_are_400_with_their_param(request_body: dict[str, Any], param: str, fragment: str) -> None:
    assert_rule(request_body, param, fragment)


def test_every_accepted_block_type_passes() -> None:
    blocks = {
        "text": {"type": "text", "text": "hi"},
        "image": IMAGE,
        "document": {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
        "tool_use": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
        "tool_result": {"type": "tool_result", "tool_use_id": "toolu_1"},
        "thinking": {"type": "thinking", "thinking": "hmm", "signature": ""},
        "redacted_thinking": {"type": "redacted_thinking", "data": "opaque"},
        "server_tool_use": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        "search_result": {"type": "search_result", "source": "s", "title": "t", "content": []},
        "web_search_tool_result": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        "tool_search_tool_result": {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_2", "content": {}},
        "tool_reference": {"type": "tool_reference", "tool_name": "f"},
    }
    assert set(blocks) == set(ACCEPTED_BLOCK_TYPES) == {
        "text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "server_tool_use",
        "search_result", "web_search_tool_result", "tool_search_tool_result", "tool_reference",
    }  # fmt: skip
    accepted(user(*blocks.values()))


ACCEPTED: list[dict[str, Any]] = [
    body(max_tokens=1),
    body(messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]),
    body(messages=[{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                   {"role": "user", "content": ""}, {"role": "assistant", "content": []}]),
    body(tool_choice={"type": "none"}),
    body(tools=[], tool_choice={"type": "none"}),
    body(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
    body(tools=[BASH], tool_choice={"type": "any"}),
    body(tools=[{**WEATHER, "type": "custom"}], tool_choice={"type": "tool", "name": "get_weather"}),
    body(tools=[TOOLSET], mcp_servers=SERVERS, tool_choice={"type": "auto"}),
    body(thinking={"type": "enabled", "budget_tokens": 1}),
    body(thinking={"type": "enabled", "budget_tokens": 1024, "display": "summarized"}),
    body(thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"}),
    body(thinking={"type": "adaptive"}),
    body(thinking={"type": "adaptive", "display": "omitted", "display_extra": 1}),
    body(thinking={"type": "disabled"}),
    body(thinking={"type": "enabled", "budget_tokens": 2048, "display": None}),
    body(service_tier="auto"),
    body(service_tier="standard_only"),
    body(stop_sequences=[]),
    body(stop_sequences=["\n\nHuman:", "END"]),
    body(container="container_abc"),
    body(container={"id": "container_abc"}),
    body(temperature=0, top_p=1, top_k=40),
    body(temperature=0.7, top_p=0.9),
    body(system="", metadata={}),
    body(system=None, tools=None, tool_choice=None, thinking=None, stop_sequences=None, temperature=None,
         top_p=None, top_k=None, metadata=None, service_tier=None, container=None, mcp_servers=None, stream=None),
    body(metadata={"user_id": None}),
]  # fmt: skip


@pytest.mark.parametrize("request_body", ACCEPTED)
def test_accepted_shapes(request_body: dict[str, Any]) -> None:
    accepted(request_body)


# --- a full body: kept as sent, read into MessagesRequest ------------------------------------------------


def full_body() -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Answer in French."}],
        "messages": [
            {"role": "system", "content": "Inline system turn"},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, IMAGE]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call the tool.", "signature": ""},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "18C"}],
                 "is_error": False},
            ]},
        ],
        "tools": [WEATHER, BASH, TOOLSET, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 2048, "display": "summarized"},
        "stop_sequences": ["END", "STOP"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "stream": True,
        "metadata": {"user_id": "user-7", "other": [1, 2.50]},
        "service_tier": "standard_only",
        "container": {"id": "container_1", "skills": []},
        "mcp_servers": SERVERS,
        "rid": "req-1",
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": {"type": "object"}}},
        "x_unknown": {"nested": [None, True, 1e300]},
    }


def test_a_full_body_with_unmodelled_fields_passes_unchanged_and_is_read_once() -> None:
    request = full_body()
    sent = copy.deepcopy(request)
    checked = validate_messages(request)
    assert checked.body is request and request == sent
    assert (checked.model, checked.stream, checked.modified) == (MODEL, True, False)
    parsed: MessagesRequest = checked.parsed
    assert parsed == MessagesRequest(
        model=MODEL,
        max_tokens=1024,
        system=("You are terse.", "Answer in French."),
        messages=request["messages"],
        custom_tools=(CustomTool("get_weather", "Weather at a place", {"type": "object"}),),
        other_tools=(BASH, TOOLSET, request["tools"][3]),
        tool_choice=ToolChoice("tool", "get_weather"),
        thinking=Thinking("enabled", 2048, "summarized"),
        stop_sequences=("END", "STOP"),
        temperature=0.5,
        top_p=0.9,
        top_k=20,
        stream=True,
        user_id="user-7",
        has_mcp_toolset=True,
    )
    assert parsed.messages is request["messages"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.model = "other"  # type: ignore[misc]


def test_a_minimal_body_reads_as_unset() -> None:
    checked = validate_messages(body(stream=False, system="Be brief."))
    assert checked.stream is False
    assert checked.parsed == MessagesRequest(
        MODEL, 64, ("Be brief.",), checked.body["messages"], (), (), None, None, (), None, None, None, False, None,
        False,
    )  # fmt: skip


def test_thinking_and_tool_choice_are_read() -> None:
    adaptive = accepted(body(thinking={"type": "adaptive", "display": "omitted"}, tools=[WEATHER],
                             tool_choice={"type": "any"}))  # fmt: skip
    assert adaptive.thinking == Thinking("adaptive", None, "omitted")
    assert adaptive.tool_choice == ToolChoice("any", None)
    assert accepted(body(thinking={"type": "disabled"})).thinking == Thinking("disabled", None, None)
    assert accepted(body(tool_choice={"type": "none"})).tool_choice == ToolChoice("none", None)


# --- count_tokens -----------------------------------------------------------------------------------


def test_count_tokens_needs_no_max_tokens_and_keeps_other_fields_unread() -> None:
    request = count_body(
        system="Be brief.", tools=[WEATHER, TOOLSET], tool_choice={"type": "tool", "name": "get_weather"},
        thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=0, temperature="hot", stream=True,
        stop_sequences=5, service_tier="priority", context_management={"edits": []},
    )  # fmt: skip
    sent = copy.deepcopy(request)
    checked = validate_count_tokens(request)
    assert checked.body == sent and checked.modified is False
    assert (checked.model, checked.stream) == (MODEL, False)
    assert checked.parsed == MessagesRequest(
        MODEL, None, ("Be brief.",), request["messages"], (CustomTool("get_weather", "Weather at a place",
        {"type": "object"}),), (TOOLSET,), ToolChoice("tool", "get_weather"), Thinking("enabled", 1024, None), (),
        None, None, None, False, None, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": MODEL}, "messages"),
        (count_body(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
        (count_body(system=[{"type": "text", "text": None}]), "system[0].text"),
        (count_body(tools=[5]), "tools[0]"),
        (count_body(tool_choice=[]), "tool_choice"),
        (count_body(thinking=1), "thinking"),
    ],
)
def test_count_tokens_wrong_types_are_json_parse_errors(request_body: Any, field: str) -> None:
    assert_parse_error(request_body, field, validate_count_tokens)


@pytest.mark.parametrize(
    ("request_body", "param", "fragment"),
    [
        (count_body(model=""), "model", "empty"),
        (count_body(messages=[]), "messages", "empty"),
        (count_body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role", "user"),
        (count_body(messages=[{"role": "user", "content": [{"type": "mcp_tool_use"}]}]),
         "messages[0].content[0].type", "mcp_tool_use blocks are not accepted"),
        (count_body(tool_choice={"type": "any"}), "tool_choice", "requires tools"),
        (count_body(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), "tool_choice.name", "'nope'"),
        (count_body(thinking={"type": "enabled", "budget_tokens": 0}), "thinking.budget_tokens", "at least 1"),
        (count_body(tools=[{"name": "f", "input_schema": None}]), "tools[0].input_schema", "object"),
    ],
)  # fmt: skip
def test_count_tokens_rule_violations(request_body: dict[str, Any], param: str, fragment: str) -> None:
    assert_rule(request_body, param, fragment, validate_count_tokens)


# --- the anthropic SDK's own request shapes ----------------------------------------------------------


def _wire(params: Any) -> Any:
    """What goes over the wire: the SDK's TypedDicts are plain dicts, sent as JSON."""
    return orjson.loads(orjson.dumps(params))


def test_sdk_user_content_with_text_image_and_documents() -> None:
    content: list[Any] = [
        TextBlockParam(type="text", text="Compare these.", cache_control={"type": "ephemeral"}),
        ImageBlockParam(type="image", source=Base64ImageSourceParam(type="base64", media_type="image/png",
                                                                    data="iVBORw0KGgo=")),
        ImageBlockParam(type="image", source=URLImageSourceParam(type="url", url="https://example.com/cat.jpg")),
        DocumentBlockParam(type="document", source=Base64PDFSourceParam(type="base64", media_type="application/pdf",
                                                                        data="JVBERi0xLjQ="), title="Report"),
        DocumentBlockParam(type="document", source=PlainTextSourceParam(type="text", media_type="text/plain",
                                                                        data="Plain notes"),
                           citations={"enabled": True}),
        SearchResultBlockParam(type="search_result", source="https://example.com", title="Result",
                               content=[TextBlockParam(type="text", text="snippet")]),
    ]  # fmt: skip
    message: MessageParam = {"role": "user", "content": content}
    params: MessageCreateParamsNonStreaming = {
        "model": MODEL, "max_tokens": 256, "messages": [message], "system": "Be precise.",
        "metadata": MetadataParam(user_id="u-1"), "stop_sequences": ["</answer>"],
    }  # fmt: skip
    parsed = accepted(_wire(params))
    assert parsed.system == ("Be precise.",) and parsed.user_id == "u-1"


def test_sdk_tool_use_round_trip() -> None:
    weather = ToolParam(name="get_weather", description="Weather at a place",
                        input_schema={"type": "object", "properties": {"city": {"type": "string"}},
                                      "required": ["city"]})  # fmt: skip
    messages: list[MessageParam] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            TextBlockParam(type="text", text="Let me check."),
            ToolUseBlockParam(type="tool_use", id="toolu_01A", name="get_weather", input={"city": "Paris"}),
        ]},
        {"role": "user", "content": [
            ToolResultBlockParam(type="tool_result", tool_use_id="toolu_01A", content=[
                TextBlockParam(type="text", text="18C, cloudy"),
                ImageBlockParam(type="image", source=URLImageSourceParam(type="url", url="https://example.com/m.png")),
                ToolReferenceBlockParam(type="tool_reference", tool_name="get_weather"),
            ]),
            ToolResultBlockParam(type="tool_result", tool_use_id="toolu_01B", content="timeout", is_error=True),
        ]},
    ]  # fmt: skip
    params: MessageCreateParamsNonStreaming = {
        "model": MODEL, "max_tokens": 512, "messages": messages,
        "tools": [weather, ToolBash20250124Param(type="bash_20250124", name="bash")],
        "tool_choice": ToolChoiceToolParam(type="tool", name="get_weather"),
    }  # fmt: skip
    parsed = accepted(_wire(params))
    assert [tool.name for tool in parsed.custom_tools] == ["get_weather"]
    assert parsed.other_tools == ({"type": "bash_20250124", "name": "bash"},)
    assert parsed.tool_choice == ToolChoice("tool", "get_weather")


def test_sdk_thinking_blocks_in_assistant_turns() -> None:
    messages: list[MessageParam] = [
        {"role": "user", "content": "Solve 2+2."},
        {"role": "assistant", "content": [
            ThinkingBlockParam(type="thinking", thinking="2+2 is 4.", signature="sig=="),
            RedactedThinkingBlockParam(type="redacted_thinking", data="EmwKAhgBEgy"),
            TextBlockParam(type="text", text="4"),
        ]},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": [
            ServerToolUseBlockParam(type="server_tool_use", id="srvtoolu_1", name="web_search", input={"query": "x"}),
            WebSearchToolResultBlockParam(type="web_search_tool_result", tool_use_id="srvtoolu_1", content=[
                WebSearchResultBlockParam(type="web_search_result", title="t", url="https://example.com",
                                          encrypted_content="abc"),
            ]),
            ToolSearchToolResultBlockParam(type="tool_search_tool_result", tool_use_id="srvtoolu_2",
                content=ToolSearchToolSearchResultBlockParam(type="tool_search_tool_search_result", tool_references=[
                    ToolReferenceBlockParam(type="tool_reference", tool_name="get_weather")])),
        ]},
    ]  # fmt: skip
    enabled: MessageCreateParamsNonStreaming = {
        "model": MODEL, "max_tokens": 4096, "messages": messages,
        "thinking": ThinkingConfigEnabledParam(type="enabled", budget_tokens=2048, display="omitted"),
    }  # fmt: skip
    assert accepted(_wire(enabled)).thinking == Thinking("enabled", 2048, "omitted")
    adaptive: MessageCountTokensParams = {
        "model": MODEL, "messages": messages, "thinking": ThinkingConfigAdaptiveParam(type="adaptive"),
    }  # fmt: skip
    assert accepted(_wire(adaptive), validate_count_tokens).thinking == Thinking("adaptive", None, None)
    # The SDK knows a fourth thinking shape the spec does not list: refused as a rule violation.
    between: MessageCreateParamsNonStreaming = {
        "model": MODEL, "max_tokens": 64, "messages": messages,
        "thinking": ThinkingConfigBetweenToolsParam(type="between_tools"),
    }  # fmt: skip
    assert_rule(_wire(between), "thinking.type", "enabled, adaptive, disabled")


# --- arbitrary JSON: the spec's 400 or acceptance, never anything else --------------------------------

MESSAGES_FIELDS = [
    "model", "messages", "max_tokens", "system", "stream", "temperature", "top_p", "top_k", "stop_sequences",
    "tools", "tool_choice", "thinking", "metadata", "service_tier", "container", "mcp_servers", "rid",
]  # fmt: skip
GOOD_BLOCKS = [
    {"type": "text", "text": "hi"},
    IMAGE,
    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
    {"type": "thinking", "thinking": "hmm", "signature": ""},
    {"type": "redacted_thinking", "data": "opaque"},
    {"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "x"}]},
    {"type": "tool_reference", "tool_name": "get_weather"},
]
BLOCK_FIELDS = [
    "type", "text", "source", "id", "name", "input", "tool_use_id", "content", "is_error", "thinking", "signature",
    "data", "title", "tool_name",
]  # fmt: skip
KINDS = st.sampled_from([*ACCEPTED_BLOCK_TYPES, "mcp_tool_use", "mcp_tool_result", "video"])
# Mostly well-formed blocks, messages and bodies with a few fields replaced, so that the cases reach
# every check (and some pass) instead of stopping at the first.
BLOCK = st.sampled_from(GOOD_BLOCKS) | st.builds(
    lambda block, changes: {**block, **changes},
    st.sampled_from(GOOD_BLOCKS),
    st.dictionaries(st.sampled_from(BLOCK_FIELDS), KINDS | JSON, min_size=1, max_size=2),
)
MESSAGE = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["user", "assistant", "system"]),
    st.text(max_size=4) | st.lists(BLOCK, max_size=3),
) | st.builds(
    lambda message, changes: {**message, **changes},
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(BLOCK, max_size=2)}),
    st.dictionaries(st.sampled_from(["role", "content"]), JSON, min_size=1, max_size=2),
)
TOOL = st.sampled_from([WEATHER, BASH, TOOLSET]) | st.dictionaries(
    st.sampled_from(["type", "name", "input_schema", "description"]), JSON, max_size=4
)
SPECIFIC = st.fixed_dictionaries({}, optional={
    "system": st.text(max_size=4) | st.lists(st.just({"type": "text", "text": "s"}) | JSON, max_size=2),
    "tools": st.lists(TOOL, max_size=3),
    "tool_choice": st.builds(lambda kind, name: {"type": kind, "name": name},
                             st.sampled_from(["auto", "any", "tool", "none", "required"]),
                             st.sampled_from(["get_weather", "bash"]) | JSON),
    "thinking": st.builds(lambda kind, budget, display: {"type": kind, "budget_tokens": budget, "display": display},
                          st.sampled_from(["enabled", "adaptive", "disabled"]),
                          st.none() | st.integers(-2, 4096) | JSON,
                          st.sampled_from([None, "summarized", "omitted"]) | JSON),
    "mcp_servers": st.just(SERVERS) | JSON,
    "stop_sequences": st.lists(st.text(max_size=4), max_size=3) | JSON,
    "service_tier": st.sampled_from(["auto", "standard_only", "priority"]) | JSON,
})  # fmt: skip
BODIES = st.builds(
    lambda messages, specific, changes, extra: {**body(messages=messages), **specific, **changes, **extra},
    st.lists(MESSAGE, min_size=1, max_size=3),
    SPECIFIC,
    st.dictionaries(st.sampled_from(MESSAGES_FIELDS), JSON, max_size=1),
    st.dictionaries(st.text(max_size=6), JSON, max_size=2),
)


def _accepts_or_400(validate: Validator, request: Any) -> None:
    sent = copy.deepcopy(request)
    try:
        checked = validate(request)
    except GatewayError as error:
        assert error.status == 400 and error.error_type == "invalid_request_error", error.to_dict()
        assert error.code == 400 or (error.code == "json_parse_error" and error.param is None), error.to_dict()
        assert error.message
        return
    assert checked.body == sent and checked.modified is False
    assert isinstance(checked.parsed, MessagesRequest)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODIES | JSON)
def test_arbitrary_json_gets_acceptance_or_the_specs_400(request: Any) -> None:
    _accepts_or_400(validate_messages, request)
    _accepts_or_400(validate_count_tokens, request)
