"""POST /parse/function_call and POST /parse/reasoning (spec 3, Other control-plane routes): the
reference gateway's shapes over the gateway's own parsers, every refusal a 400 in the admin envelope,
and control-plane auth like every control route."""

from __future__ import annotations

import json
from typing import Any, Iterator

import orjson
import pytest
from django.conf import settings
from django.test import Client

from administration.api.openapi import SCHEMA_PATH
from administration.control_auth import reset_control_plane_auth
from common.config import GatewayConfig, install_config
from tests.conftest import ALICE, SHARED_KEY, GatewayFactory

FUNCTION_CALL = "/parse/function_call"
REASONING = "/parse/reasoning"
ADMIN_KEY = "sk-cp-admin-parse"
VIEWER_KEY = "sk-cp-viewer-parse"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
# A string-typed argument whose value reads as JSON: only the tools say it stays a string.
CODE_TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}},
}


@pytest.fixture
def configure() -> Iterator[Any]:
    def apply(config: GatewayConfig) -> None:
        install_config(config, export=False)
        reset_control_plane_auth()

    apply(GatewayConfig())
    yield apply
    install_config(GatewayConfig(), export=False)
    reset_control_plane_auth()


@pytest.fixture
def client(configure: Any) -> Client:
    """An open control plane (no keys configured)."""
    return Client()


def post(client: Client, path: str, body: Any, key: str | None = None, raw: bytes | None = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    data = raw if raw is not None else orjson.dumps(body)
    return client.post(path, data, content_type="application/json", **headers)


def calls(*pairs: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The expected ``tool_calls``: arguments as the JSON text the parsers write."""
    return [{"function": {"name": name, "arguments": json.dumps(arguments)}} for name, arguments in pairs]


def refused(answer: Any, *words: str) -> None:
    """A 400 in the general admin envelope whose message holds ``words``."""
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/json"
    body = answer.json()
    assert set(body) == {"error"} and body["error"]["type"] == "bad_request", body
    for word in words:
        assert word in body["error"]["message"], (word, body)


# --- /parse/function_call ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parser", "text", "remaining", "expected"),
    [
        pytest.param(
            "qwen",
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "Let me check.",
            calls(("get_weather", {"city": "Paris"})),
            id="qwen",
        ),
        pytest.param(
            "hermes",
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}</tool_call>',
            "",
            calls(("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "days": 2})),
            id="hermes-two-calls",
        ),
        pytest.param(
            "llama",
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
            "",
            calls(("get_weather", {"city": "Paris"})),
            id="llama-python-tag",
        ),
        pytest.param(
            "llama3_json",
            '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", "parameters": {}}',
            "",
            calls(("get_weather", {"city": "Paris"}), ("get_weather", {})),
            id="llama-bare-json",
        ),
        pytest.param(
            "mistral",
            'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]',
            "Sure.",
            calls(("get_weather", {"city": "Paris"})),
            id="mistral-v03",
        ),
        pytest.param(
            "mistral",
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
            "",
            calls(("get_weather", {"city": "Paris"})),
            id="mistral-named",
        ),
        pytest.param(
            "deepseek_v3",
            "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            "Checking.",
            calls(("get_weather", {"city": "Paris"})),
            id="deepseek-v3",
        ),
        pytest.param(
            "deepseek31",
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "",
            calls(("get_weather", {"city": "Paris"})),
            id="deepseek-v31",
        ),
        pytest.param(
            "pythonic",
            '[get_weather(city="Paris", days=3)]',
            "",
            calls(("get_weather", {"city": "Paris", "days": 3})),
            id="pythonic",
        ),
        pytest.param(
            "glm45",
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
            "",
            calls(("get_weather", {"city": "Paris", "days": 3})),
            id="glm45",
        ),
        pytest.param("qwen", "No tools needed: 2 + 2 = 4.", "No tools needed: 2 + 2 = 4.", [], id="no-call"),
        pytest.param(
            "qwen", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", [], id="malformed"
        ),
        pytest.param("json", "", "", [], id="empty-text"),
    ],
)
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_each_family_is_parsed_in_the_reference_shape(
    client: Client, parser: str, text: str, remaining: str, expected: list[dict[str, Any]], with_tools: bool
) -> None:
    body: dict[str, Any] = {"text": text, "tool_call_parser": parser}
    if with_tools:
        body["tools"] = [WEATHER]
    answer = post(client, FUNCTION_CALL, body)
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"remaining_text": remaining, "tool_calls": expected, "success": True}


@pytest.mark.parametrize("parser", ["glm45", "minimax_m2"])
def test_the_tools_type_the_values_of_the_xml_formats(client: Client, parser: str) -> None:
    if parser == "glm45":
        text = "<tool_call>lookup<arg_key>code</arg_key><arg_value>42</arg_value></tool_call>"
    else:
        text = '<minimax:tool_call>\n<invoke name="lookup">\n<parameter name="code">42</parameter>\n</invoke>\n</minimax:tool_call>'
    typed = post(client, FUNCTION_CALL, {"text": text, "tool_call_parser": parser, "tools": [CODE_TOOL]})
    assert typed.status_code == 200, typed.content
    assert typed.json()["tool_calls"] == calls(("lookup", {"code": "42"}))
    untyped = post(client, FUNCTION_CALL, {"text": text, "tool_call_parser": parser, "tools": []})
    assert untyped.json()["tool_calls"] == calls(("lookup", {"code": 42}))


def test_parser_names_ignore_case_and_dashes(client: Client) -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    for name in ("Qwen25", "HERMES", "llama3-json"):
        answer = post(client, FUNCTION_CALL, {"text": text, "tool_call_parser": name, "tools": [WEATHER]})
        assert answer.status_code == 200, name


def test_an_unknown_tool_parser_is_400_naming_the_known_ones(client: Client) -> None:
    answer = post(client, FUNCTION_CALL, {"text": "hi", "tool_call_parser": "nonexistent_parser", "tools": []})
    refused(answer, "Unknown tool parser: nonexistent_parser", "hermes", "mistral")
    long_name = post(client, FUNCTION_CALL, {"text": "hi", "tool_call_parser": "x" * 10_000})
    refused(long_name)
    assert len(long_name.json()["error"]["message"]) < 2_000


def test_a_reasoning_parser_name_is_not_a_tool_parser(client: Client) -> None:
    refused(post(client, FUNCTION_CALL, {"text": "hi", "tool_call_parser": "deepseek_r1"}), "Unknown tool parser")


def test_a_call_nested_past_the_parsers_depth_is_text(client: Client) -> None:
    # JSON nested past Python's recursion limit inside a call region: not a call, and not a 500.
    for parser, text in (("qwen", "<tool_call>" + "[" * 100_000 + "</tool_call>"), ("json", "[" * 100_000)):
        answer = post(client, FUNCTION_CALL, {"text": text, "tool_call_parser": parser})
        assert answer.status_code == 200, answer.content
        assert answer.json()["tool_calls"] == [] and answer.json()["remaining_text"]


# --- /parse/reasoning -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "normal"),
    [
        pytest.param("deepseek_r1", "I should add.\n</think>\n\nThe answer is 4.", "I should add.", "The answer is 4.",
                     id="deepseek-r1-opened-by-prompt"),
        pytest.param("deepseek-r1", "<think>\nI should add.\n</think>\n\nThe answer is 4.", "I should add.",
                     "The answer is 4.", id="deepseek-r1-0528-writes-the-marker"),
        pytest.param("deepseek_r1", "Still thinking", "Still thinking", "", id="deepseek-r1-cut-inside"),
        pytest.param("qwen3", "<think>\nHmm.\n</think>\n\nHello!", "Hmm.", "Hello!", id="qwen3"),
        pytest.param("qwq", "Hmm.</think>Hello!", "Hmm.", "Hello!", id="qwq-opened-by-prompt"),
        pytest.param("deepseek_v3", "Hello!", "", "Hello!", id="deepseek-v3-no-reasoning"),
        pytest.param("deepseek_v31", "<think>Hmm.</think>Hello!", "Hmm.", "Hello!", id="deepseek-v31"),
        pytest.param("kimi", "\u25c1think\u25b7Hmm.\u25c1/think\u25b7Hello!", "Hmm.", "Hello!", id="kimi"),
        pytest.param("glm45", "<think>Hmm.</think>Hello!", "Hmm.", "Hello!", id="glm45"),
        pytest.param("step3", "", "", "", id="empty-text"),
    ],
)
def test_reasoning_is_separated_in_the_reference_shape(
    client: Client, parser: str, text: str, reasoning: str, normal: str
) -> None:
    answer = post(client, REASONING, {"text": text, "reasoning_parser": parser})
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"normal_text": normal, "reasoning_text": reasoning, "success": True}


def test_an_unknown_reasoning_parser_is_400(client: Client) -> None:
    refused(post(client, REASONING, {"text": "hi", "reasoning_parser": "invalid_parser_type"}),
            "Unknown reasoning parser: invalid_parser_type", "deepseek_r1", "qwen3")
    refused(post(client, REASONING, {"text": "hi", "reasoning_parser": "hermes"}), "Unknown reasoning parser")


# --- bodies ----------------------------------------------------------------------------------------------


GOOD_TOOL_CALL = {"text": "hi", "tool_call_parser": "qwen"}
GOOD_REASONING = {"text": "hi", "reasoning_parser": "qwen3"}


def _tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **function}}


@pytest.mark.parametrize(
    ("path", "raw", "words"),
    [
        (FUNCTION_CALL, b"", ("not valid JSON",)),
        (FUNCTION_CALL, b"{", ("not valid JSON",)),
        (FUNCTION_CALL, b"[" * 5_000 + b"]" * 5_000, ("not valid JSON",)),
        (FUNCTION_CALL, b'{"text": "\\ud800", "tool_call_parser": "qwen"}', ("not valid JSON",)),
        (FUNCTION_CALL, b"\xff\xfe", ("not valid JSON",)),
        (FUNCTION_CALL, b"[]", ("JSON object",)),
        (FUNCTION_CALL, b'"text"', ("JSON object",)),
        (REASONING, b"{", ("not valid JSON",)),
        (REASONING, b"null", ("JSON object",)),
    ],
)
def test_a_body_that_is_not_a_json_object_is_400(client: Client, path: str, raw: bytes, words: tuple[str, ...]) -> None:
    refused(post(client, path, None, raw=raw), *words)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"tool_call_parser": "qwen"}, ("'text' is required",)),
        ({"text": None, "tool_call_parser": "qwen"}, ("'text' is required",)),
        ({"text": 1, "tool_call_parser": "qwen"}, ("'text' must be a string",)),
        ({"text": ["a"], "tool_call_parser": "qwen"}, ("'text' must be a string",)),
        ({"text": "hi"}, ("'tool_call_parser' is required",)),
        ({"text": "hi", "tool_call_parser": 7}, ("'tool_call_parser' must be a string",)),
        ({**GOOD_TOOL_CALL, "tools": None}, ("'tools' must be an array",)),
        ({**GOOD_TOOL_CALL, "tools": {"type": "function"}}, ("'tools' must be an array",)),
        ({**GOOD_TOOL_CALL, "tools": ["get_weather"]}, ("'tools[0]' must be an object",)),
        ({**GOOD_TOOL_CALL, "tools": [WEATHER, {"function": {"name": "f"}}]}, ("'tools[1].type' is required",)),
        ({**GOOD_TOOL_CALL, "tools": [{"type": 1, "function": {"name": "f"}}]}, ("'tools[0].type' must be a string",)),
        ({**GOOD_TOOL_CALL, "tools": [{"type": "function"}]}, ("'tools[0].function' is required",)),
        ({**GOOD_TOOL_CALL, "tools": [{"type": "function", "function": "f"}]}, ("tools[0].function",)),
        ({**GOOD_TOOL_CALL, "tools": [{"type": "function", "function": {}}]}, ("'tools[0].function.name' is required",)),
        ({**GOOD_TOOL_CALL, "tools": [_tool(name=3)]}, ("'tools[0].function.name' must be a string",)),
        ({**GOOD_TOOL_CALL, "tools": [_tool(description=3)]}, ("'tools[0].function.description' must be a string",)),
        ({**GOOD_TOOL_CALL, "tools": [_tool(parameters=[])]}, ("'tools[0].function.parameters' must be an object",)),
        ({**GOOD_TOOL_CALL, "tools": [_tool(strict="yes")]}, ("'tools[0].function.strict' must be a boolean",)),
    ],
)
def test_a_missing_or_wrongly_typed_tool_call_field_is_400(
    client: Client, body: dict[str, Any], words: tuple[str, ...]
) -> None:
    refused(post(client, FUNCTION_CALL, body), *words)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"reasoning_parser": "qwen3"}, ("'text' is required",)),
        ({"text": 1.5, "reasoning_parser": "qwen3"}, ("'text' must be a string",)),
        ({"text": "hi"}, ("'reasoning_parser' is required",)),
        ({"text": "hi", "reasoning_parser": None}, ("'reasoning_parser' is required",)),
        ({"text": "hi", "reasoning_parser": {"name": "qwen3"}}, ("'reasoning_parser' must be a string",)),
    ],
)
def test_a_missing_or_wrongly_typed_reasoning_field_is_400(
    client: Client, body: dict[str, Any], words: tuple[str, ...]
) -> None:
    refused(post(client, REASONING, body), *words)


def test_optional_tool_fields_may_be_null_and_extra_fields_are_ignored(client: Client) -> None:
    tool = {"type": "function", "function": {"name": "f", "description": None, "parameters": None, "strict": None}}
    answer = post(client, FUNCTION_CALL, {**GOOD_TOOL_CALL, "tools": [tool], "stream": True, "model": "m"})
    assert answer.status_code == 200 and answer.json()["success"] is True
    assert post(client, REASONING, {**GOOD_REASONING, "extra": [1]}).status_code == 200


def test_a_body_over_the_control_plane_limit_is_413(client: Client) -> None:
    text = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    for path, body in ((FUNCTION_CALL, {**GOOD_TOOL_CALL, "text": text}), (REASONING, {**GOOD_REASONING, "text": text})):
        answer = post(client, path, body)
        assert answer.status_code == 413, path
        assert answer.json()["error"]["code"] == "payload_too_large"


def test_only_post_is_answered(client: Client) -> None:
    for path in (FUNCTION_CALL, REASONING):
        assert client.get(path).status_code == 405
        assert client.put(path, b"{}", content_type="application/json").status_code == 405


# --- control-plane auth -----------------------------------------------------------------------------------

ROUTES = [(FUNCTION_CALL, GOOD_TOOL_CALL), (REASONING, GOOD_REASONING)]


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_with_control_plane_keys_only_an_admin_key_passes(configure: Any, path: str, body: dict[str, Any]) -> None:
    configure(GatewayConfig(
        api_key=SHARED_KEY,
        tenant_api_keys=((ALICE.tenant_id, ALICE.key),),
        control_plane_api_keys=(("k1", "ops", "admin", ADMIN_KEY), ("k2", "viewer", "user", VIEWER_KEY)),
    ))
    client = Client()
    assert post(client, path, body, ADMIN_KEY).status_code == 200
    forbidden = post(client, path, body, VIEWER_KEY)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "forbidden"
    for key in (None, "wrong", SHARED_KEY, ALICE.key):
        denied = post(client, path, body, key)
        assert denied.status_code == 401, key
        assert denied.json()["error"]["type"] == "unauthorized" and denied["WWW-Authenticate"] == "Bearer"
    # The credential is checked before the body: a bad body without one is still 401.
    assert post(client, path, None, raw=b"{").status_code == 401


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_without_control_plane_auth_only_the_shared_key_passes(configure: Any, path: str, body: dict[str, Any]) -> None:
    configure(GatewayConfig(api_key=SHARED_KEY, tenant_api_keys=((ALICE.tenant_id, ALICE.key),)))
    client = Client()
    assert post(client, path, body, SHARED_KEY).status_code == 200
    assert post(client, path, body, ALICE.key).status_code == 401
    assert post(client, path, body).status_code == 401


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_tenant_keys_without_a_shared_key_close_the_routes(configure: Any, path: str, body: dict[str, Any]) -> None:
    configure(GatewayConfig(tenant_api_keys=((ALICE.tenant_id, ALICE.key),)))
    client = Client()
    assert post(client, path, body, ALICE.key).status_code == 401
    assert post(client, path, body).status_code == 401


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_no_keys_leave_the_routes_open(client: Client, path: str, body: dict[str, Any]) -> None:
    assert post(client, path, body).status_code == 200


async def test_the_routes_are_served_by_the_whole_asgi_application(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway([], control_plane_api_keys=(("k1", "ops", "admin", ADMIN_KEY),))
    reset_control_plane_auth()
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        text = 'Hi <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        parsed = await gateway.post(FUNCTION_CALL, json={"text": text, "tool_call_parser": "qwen"}, headers=admin)
        assert parsed.status_code == 200, parsed.text
        assert parsed.json() == {"remaining_text": "Hi", "tool_calls": calls(("get_weather", {"city": "Paris"})),
                                 "success": True}
        separated = await gateway.post(REASONING, json={"text": "<think>a</think>b", "reasoning_parser": "qwen3"},
                                       headers=admin)
        assert separated.json() == {"normal_text": "b", "reasoning_text": "a", "success": True}
        assert (await gateway.post(REASONING, json=GOOD_REASONING)).status_code == 401
    finally:
        reset_control_plane_auth()


# --- the description --------------------------------------------------------------------------------------


def test_the_description_gives_the_reference_shapes(client: Client) -> None:
    paths = orjson.loads(client.get(SCHEMA_PATH).content)["paths"]
    tool_call = paths[FUNCTION_CALL]["post"]
    request = tool_call["requestBody"]["content"]["application/json"]["schema"]
    assert request["required"] == ["text", "tool_call_parser"] and "tools" in request["properties"]
    assert request["properties"]["tools"]["items"]["required"] == ["type", "function"]
    answer = tool_call["responses"]["200"]["content"]["application/json"]["schema"]
    assert sorted(answer["required"]) == ["remaining_text", "success", "tool_calls"]
    assert answer["properties"]["tool_calls"]["items"]["properties"]["function"]["required"] == ["arguments", "name"]
    reasoning = paths[REASONING]["post"]
    assert reasoning["requestBody"]["content"]["application/json"]["schema"]["required"] == ["text", "reasoning_parser"]
    answer = reasoning["responses"]["200"]["content"]["application/json"]["schema"]
    assert sorted(answer["required"]) == ["normal_text", "reasoning_text", "success"]
    for operation in (tool_call, reasoning):
        assert {"200", "400", "401", "403", "413"} <= set(operation["responses"])
