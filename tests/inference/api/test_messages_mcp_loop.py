"""The MCP tool loop of POST /v1/messages on the Anthropic provider backend (spec 1, "Messages-style
API": MCP tool loop; "Events"; "Errors": 502 mcp_connection_failed / mcp_max_iterations; "Limits":
rounds at most 10): a real MCP server (the ``mcp`` SDK over Streamable HTTP), our stand-in Anthropic
API with its scripted model (it calls the tools its prompt's ``[[call:...]]`` markers name), and the
real anthropic SDK reading the answers in strict mode."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Iterator

import anthropic
import httpx
import httpx2
import orjson
import pytest

from common.telemetry import REGISTRY
from gateway_project.asgi import application
from inference.routing.workers import WorkerRecord, WorkerStatus
from standins.mock_provider import ProviderConfig
from tests.conftest import PROVIDER_KEY, GatewayFactory, Provider, free_port, serving_provider
from tests.inference.mcp.servers import build_server, serving

pytestmark = pytest.mark.django_db

MODEL = "claude-stand-in"
BETA = "mcp-client-2025-11-20"
MCP_ON = {"X-GW-MCP": "enabled"}
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": BETA, **MCP_ON}
TOOL_NAMES = {"echo", "fail", "slow", "big", "whoami"}


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    with serving(build_server()) as url:
        yield url


@pytest.fixture
async def claude() -> AsyncIterator[Provider]:
    async with serving_provider(ProviderConfig(models=(MODEL,), api_key=PROVIDER_KEY)) as running:
        yield running


@pytest.fixture
def gateway(make_gateway: GatewayFactory, claude: Provider) -> httpx.AsyncClient:
    record = WorkerRecord(
        id=str(uuid.uuid4()), url=claude.url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key=PROVIDER_KEY, models=(MODEL,), named_provider="anthropic",
    )  # fmt: skip
    return make_gateway([record], ssrf_allow_loopback=True, mcp_connect_timeout_secs=5.0)


def sdk() -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url="http://gateway", timeout=30)
    return anthropic.AsyncAnthropic(base_url="http://gateway", http_client=http, max_retries=0, api_key="unused",
                                    _strict_response_validation=True)  # fmt: skip


def servers(url: str, name: str = "tools", token: str | None = None) -> list[dict[str, Any]]:
    server: dict[str, Any] = {"type": "url", "name": name, "url": url}
    if token is not None:
        server["authorization_token"] = token
    return [server]


def toolset(name: str = "tools", **config: Any) -> dict[str, Any]:
    return {"type": "mcp_toolset", "mcp_server_name": name, **config}


def body(prompt: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": prompt}],
            "mcp_servers": servers(url), "tools": [toolset()], **extra}  # fmt: skip


ECHO = '[[call:echo {"text": "hi"}]]'


def events_of(text: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        kind, data = block.split("\n")
        found.append((kind.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return found


async def test_one_round_whole(gateway: httpx.AsyncClient, claude: Provider, mcp_url: str) -> None:
    message = await sdk().beta.messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": ECHO}], betas=[BETA],
        mcp_servers=servers(mcp_url), tools=[toolset()], extra_headers=MCP_ON,  # type: ignore[arg-type, list-item]
    )  # fmt: skip
    use, result, text = message.content
    assert use.type == "mcp_tool_use" and use.id.startswith("mcptoolu_")
    assert (use.name, use.server_name, use.input) == ("echo", "tools", {"text": "hi"})
    assert result.type == "mcp_tool_result" and result.tool_use_id == use.id and result.is_error is False
    assert not isinstance(result.content, str) and result.content[0].text == "echo: hi"
    assert text.type == "text" and text.text == "tool said: echo: hi"
    assert message.stop_reason == "end_turn" and message.model == MODEL
    first, second = claude.calls("/v1/messages")
    assert message.usage.output_tokens == 1 + len(text.text.split())  # both turns counted
    sent = first["json"]
    assert "mcp_servers" not in sent and sent["tool_choice"] == {"type": "auto"} and sent.get("stream") is not True
    assert {tool["name"] for tool in sent["tools"]} == TOOL_NAMES and all("type" not in t for t in sent["tools"])
    assert second["json"]["messages"][-1]["content"][0]["type"] == "tool_result"
    assert second["json"]["messages"][-1]["content"][0]["content"] == "echo: hi"
    for call in (first, second):  # the worker's key, the client's version headers; never X-GW-MCP
        assert call["headers"]["x-api-key"] == PROVIDER_KEY and call["headers"]["anthropic-beta"] == BETA
        assert "x-gw-mcp" not in call["headers"]


async def test_two_rounds_whole_and_streamed(gateway: httpx.AsyncClient, claude: Provider, mcp_url: str) -> None:
    prompt = "[[rounds:2]] " + ECHO
    request: dict[str, Any] = dict(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": prompt}], betas=[BETA],
        mcp_servers=servers(mcp_url), tools=[toolset()], extra_headers=MCP_ON,
    )  # fmt: skip
    whole = await sdk().beta.messages.create(**request)
    kinds = ["mcp_tool_use", "mcp_tool_result", "mcp_tool_use", "mcp_tool_result", "text"]
    assert [block.type for block in whole.content] == kinds
    assert len(claude.calls("/v1/messages")) == 3
    async with sdk().beta.messages.stream(**request) as stream:
        seen = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert [block.type for block in final.content] == kinds
    uses = [block for block in final.content if block.type == "mcp_tool_use"]
    results = [block for block in final.content if block.type == "mcp_tool_result"]
    assert all(use.id.startswith("mcptoolu_") and use.input == {"text": "hi"} for use in uses)
    assert [result.tool_use_id for result in results] == [use.id for use in uses]
    assert final.content[-1].type == "text" and final.content[-1].text == "tool said: echo: hi"
    assert seen[0] == "message_start" and seen.count("message_delta") == 1 and seen.count("message_stop") == 1
    assert seen[-1] == "message_stop" and final.stop_reason == "end_turn"
    assert seen.count("text") == len("tool said: echo: hi".split())  # the provider's deltas relayed as they came
    assert all(call["json"]["stream"] is True for call in claude.calls("/v1/messages")[3:])  # each turn streamed


async def test_configs_default_config_and_defer_loading_choose_the_tools(
    gateway: httpx.AsyncClient, claude: Provider, mcp_url: str
) -> None:
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {name: None for name in TOOL_NAMES}),
        ({"default_config": {"defer_loading": True}}, {name: True for name in TOOL_NAMES}),
        ({"default_config": {"enabled": False}}, {}),
        ({"default_config": {"enabled": False}, "configs": {"echo": {"enabled": True, "defer_loading": True}}},
         {"echo": True}),
        ({"configs": {"echo": {}, "fail": {"enabled": False}, "slow": {"defer_loading": False}}},
         {"echo": None, "slow": False}),
    ]  # fmt: skip
    for config, exposed in cases:
        sent = body("hello", mcp_url, tools=[toolset(**config)])
        answer = await gateway.post("/v1/messages", json=sent, headers=HEADERS)
        assert answer.status_code == 200 and answer.json()["content"][0]["text"] == "heard: hello"
        tools = claude.calls("/v1/messages")[-1]["json"]["tools"]
        assert {tool["name"]: tool.get("defer_loading") for tool in tools} == exposed, config


async def test_the_client_tool_choice_and_own_tools_are_kept(gateway: httpx.AsyncClient, claude: Provider, mcp_url: str) -> None:
    own = {"name": "lookup", "description": "the client's own", "input_schema": {"type": "object"}}
    sent = body("hello", mcp_url, tools=[own, toolset()], tool_choice={"type": "any"})
    answer = await gateway.post("/v1/messages", json=sent, headers=HEADERS)
    assert answer.status_code == 200
    upstream = claude.calls("/v1/messages")[-1]["json"]
    assert upstream["tool_choice"] == {"type": "any"} and upstream["tools"][0] == own
    assert {tool["name"] for tool in upstream["tools"]} == TOOL_NAMES | {"lookup"}


async def test_a_failing_tool_is_an_error_result_not_a_failed_request(gateway: httpx.AsyncClient, mcp_url: str) -> None:
    answer = await gateway.post("/v1/messages", json=body('[[call:fail {"reason": "disk full"}]]', mcp_url), headers=HEADERS)
    assert answer.status_code == 200
    result = answer.json()["content"][1]
    assert result["type"] == "mcp_tool_result" and result["is_error"] is True
    assert "disk full" in result["content"][0]["text"]


def _tool_metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"model": MODEL, **labels}) or 0.0


async def test_each_tool_call_is_counted_by_result_and_timed(gateway: httpx.AsyncClient, mcp_url: str) -> None:
    """gw_mcp_tool_calls_total{model, tool_name, result} and gw_mcp_tool_duration_seconds (spec 3)."""
    echoed = _tool_metric("gw_mcp_tool_calls_total", tool_name="echo", result="success")
    failed = _tool_metric("gw_mcp_tool_calls_total", tool_name="fail", result="error")
    timed = _tool_metric("gw_mcp_tool_duration_seconds_count", tool_name="echo")
    answer = await gateway.post("/v1/messages", json=body(ECHO, mcp_url), headers=HEADERS)
    assert answer.status_code == 200
    answer = await gateway.post("/v1/messages", json=body('[[call:fail {"reason": "disk full"}]]', mcp_url), headers=HEADERS)
    assert answer.status_code == 200 and answer.json()["content"][1]["is_error"] is True
    assert _tool_metric("gw_mcp_tool_calls_total", tool_name="echo", result="success") == echoed + 1
    assert _tool_metric("gw_mcp_tool_calls_total", tool_name="echo", result="error") == 0
    assert _tool_metric("gw_mcp_tool_calls_total", tool_name="fail", result="error") == failed + 1
    assert _tool_metric("gw_mcp_tool_duration_seconds_count", tool_name="echo") == timed + 1
    assert _tool_metric("gw_mcp_tool_duration_seconds_sum", tool_name="echo") > 0


async def test_still_calling_after_ten_rounds_is_502_or_an_error_event(
    gateway: httpx.AsyncClient, claude: Provider, mcp_url: str
) -> None:
    endless = body("[[rounds:99]] " + ECHO, mcp_url)
    answer = await gateway.post("/v1/messages", json=endless, headers=HEADERS)
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "mcp_max_iterations"
    assert answer.headers["x-gw-error-code"] == "mcp_max_iterations"
    assert len(claude.calls("/v1/messages")) == 11  # the first turn and one after each of the 10 rounds
    claude.state.requests.clear()
    async with gateway.stream("POST", "/v1/messages", json={**endless, "stream": True}, headers=HEADERS) as streamed:
        assert streamed.status_code == 200
        events = events_of((await streamed.aread()).decode())
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "message_start" and kinds[-1] == "error"
    assert "message_delta" not in kinds and "message_stop" not in kinds
    starts = [data["content_block"]["type"] for kind, data in events if kind == "content_block_start"]
    assert starts == ["mcp_tool_use", "mcp_tool_result"] * 10  # every round shown, then the error
    assert events[-1][1]["error"]["type"] == "api_error" and "10 rounds" in events[-1][1]["error"]["message"]
    assert len(claude.calls("/v1/messages")) == 11


async def test_no_server_connecting_is_502_whole_and_an_error_event_streamed(
    gateway: httpx.AsyncClient, claude: Provider
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/mcp"
    answer = await gateway.post("/v1/messages", json=body(ECHO, nowhere), headers=HEADERS)
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "mcp_connection_failed"
    assert "'tools'" in answer.json()["error"]["message"]
    async with gateway.stream("POST", "/v1/messages", json=body(ECHO, nowhere, stream=True), headers=HEADERS) as streamed:
        assert streamed.status_code == 200  # the stream opened before anything was asked
        events = events_of((await streamed.aread()).decode())
    assert [kind for kind, _ in events] == ["message_start", "error"]
    assert "No MCP server could be connected" in events[-1][1]["error"]["message"]
    assert not claude.calls("/v1/messages")


async def test_an_sse_url_is_refused_and_other_servers_still_serve(
    gateway: httpx.AsyncClient, claude: Provider, mcp_url: str
) -> None:
    legacy = mcp_url.removesuffix("/mcp") + "/sse"
    alone = await gateway.post("/v1/messages", json=body(ECHO, legacy), headers=HEADERS)
    assert alone.status_code == 502 and alone.json()["error"]["code"] == "mcp_connection_failed"
    assert "legacy SSE transport" in alone.json()["error"]["message"]
    both = body(ECHO, mcp_url, mcp_servers=[*servers(legacy, "old"), *servers(mcp_url)], tools=[toolset("old"), toolset()])
    answer = await gateway.post("/v1/messages", json=both, headers=HEADERS)
    assert answer.status_code == 200
    assert [block["type"] for block in answer.json()["content"]] == ["mcp_tool_use", "mcp_tool_result", "text"]
    assert answer.json()["content"][0]["server_name"] == "tools"


async def test_the_ssrf_guard_judges_server_urls(gateway: httpx.AsyncClient, claude: Provider) -> None:
    metadata = "http://169.254.169.254/mcp"  # refused even where loopback is allowed
    answer = await gateway.post("/v1/messages", json=body(ECHO, metadata), headers=HEADERS)
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "mcp_connection_failed"
    assert "refused" in answer.json()["error"]["message"]
    assert not claude.calls("/v1/messages")


async def test_the_authorization_token_goes_as_a_bearer_token(gateway: httpx.AsyncClient, mcp_url: str) -> None:
    sent = body("[[call:whoami {}]]", mcp_url, mcp_servers=servers(mcp_url, token="sekret"))
    answer = await gateway.post("/v1/messages", json=sent, headers=HEADERS)
    assert answer.json()["content"][1]["content"][0]["text"] == "Bearer sekret|None"


async def test_a_provider_error_on_the_first_turn(gateway: httpx.AsyncClient, claude: Provider, mcp_url: str) -> None:
    failing = body(ECHO, mcp_url, metadata={"provider_fail": "529"})
    whole = await gateway.post("/v1/messages", json=failing, headers=HEADERS)
    assert whole.status_code == 529 and whole.json()["error"]["type"] == "overloaded_error"  # as the provider said
    async with gateway.stream("POST", "/v1/messages", json={**failing, "stream": True}, headers=HEADERS) as streamed:
        assert streamed.status_code == 200
        events = events_of((await streamed.aread()).decode())
    assert [kind for kind, _ in events] == ["message_start", "error"]
    assert "HTTP 529" in events[-1][1]["error"]["message"]


async def test_malformed_servers_and_toolsets_are_400(gateway: httpx.AsyncClient, mcp_url: str) -> None:
    unknown = await gateway.post("/v1/messages", json=body("hi", mcp_url, tools=[toolset("other")]), headers=HEADERS)
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tools[0].mcp_server_name"
    ftp = await gateway.post("/v1/messages", json=body("hi", "ftp://example.com/mcp"), headers=HEADERS)
    assert ftp.status_code == 400 and ftp.json()["error"]["param"] == "mcp_servers[0].url"


async def test_without_the_header_the_body_goes_upstream_unchanged(
    gateway: httpx.AsyncClient, claude: Provider, mcp_url: str
) -> None:
    sent = body(ECHO, mcp_url)
    headers = {key: value for key, value in HEADERS.items() if key != "X-GW-MCP"}
    answer = await gateway.post("/v1/messages", json=sent, headers=headers)
    assert answer.status_code == 200 and answer.json()["content"][0]["type"] == "text"
    (upstream,) = claude.calls("/v1/messages")
    assert upstream["json"] == sent and upstream["headers"]["anthropic-beta"] == BETA
    with_header = await gateway.post("/v1/messages", json=body("hi", mcp_url, tools=[]), headers=HEADERS)
    assert with_header.status_code == 200  # no mcp_toolset: relayed too, the header never forwarded
    assert "x-gw-mcp" not in claude.calls("/v1/messages")[-1]["headers"]


async def test_a_turn_also_calling_the_clients_own_tool_ends_the_loop(gateway: httpx.AsyncClient, claude: Provider, mcp_url: str) -> None:
    own = {"name": "lookup", "input_schema": {"type": "object"}}
    sent = body('[[call:lookup {"q": "x"}]] ' + ECHO, mcp_url, tools=[own, toolset()])
    answer = await gateway.post("/v1/messages", json=sent, headers=HEADERS)
    message = answer.json()
    assert [block["type"] for block in message["content"]] == ["tool_use", "mcp_tool_use", "mcp_tool_result"]
    assert message["content"][0]["name"] == "lookup" and message["stop_reason"] == "tool_use"
    assert len(claude.calls("/v1/messages")) == 1  # the client answers its own call


async def test_a_provider_stream_that_breaks_ends_with_the_error_event(gateway: httpx.AsyncClient, mcp_url: str) -> None:
    broken = body(ECHO, mcp_url, stream=True, metadata={"provider_break": "1"})
    async with gateway.stream("POST", "/v1/messages", json=broken, headers=HEADERS) as streamed:
        assert streamed.status_code == 200
        kinds = [kind for kind, _ in events_of((await streamed.aread()).decode())]
    assert kinds[0] == "message_start" and kinds[-1] == "error" and "message_stop" not in kinds
