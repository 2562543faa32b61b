"""POST /v1/responses on an external OpenAI-compatible provider (spec 2, per worker kind): the gateway
drives the provider's own /v1/responses (our stand-in provider on loopback), expands history into
the upstream input, runs MCP tools itself (a real MCP server), stores the responses, and sends only
the worker's key upstream. Read with the openai SDK in strict mode."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Iterator

import httpx
import openai
import pytest

from common.telemetry import REGISTRY
from gateway_project.asgi import application
from inference.routing.workers import WorkerRecord, WorkerStatus
from tests.conftest import PROVIDER_KEY, GatewayFactory, Provider, until
from tests.inference.mcp.servers import build_server, serving
from tests.responses_api.test_responses_on_grpc import RawStream

pytestmark = pytest.mark.django_db(transaction=True)

GATEWAY_KEY = "gw-secret-key"
MODEL = "gpt-4o-mini"


def external(provider: Provider, api_key: str | None = PROVIDER_KEY) -> WorkerRecord:
    return WorkerRecord(
        id=str(uuid.uuid4()), url=provider.url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key=api_key, models=(MODEL, "gpt-4.1"),
    )  # fmt: skip


def sdk(client: httpx.AsyncClient, key: str = GATEWAY_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key=key, http_client=client,
                              _strict_response_validation=True, max_retries=0)  # fmt: skip


@pytest.fixture
def gateway(make_gateway: GatewayFactory, provider: Provider) -> httpx.AsyncClient:
    return make_gateway([external(provider)], api_key=GATEWAY_KEY, ssrf_allow_loopback=True, history_backend="db")


@pytest.fixture
def mcp_url() -> Iterator[str]:
    with serving(build_server()) as url:
        yield url


def assert_no_gateway_key(provider: Provider) -> None:
    for request in provider.state.requests:
        assert GATEWAY_KEY not in json.dumps(request["headers"]) and GATEWAY_KEY not in json.dumps(request["json"])


async def test_a_response_is_run_upstream_with_the_worker_key_and_stored(gateway: httpx.AsyncClient, provider: Provider) -> None:
    client = sdk(gateway)
    response = await client.responses.create(model=MODEL, input="hello there", instructions="be brief", metadata={"k": "v"})
    assert response.status == "completed" and response.output_text == "[be brief] heard: hello there"
    assert response.metadata == {"k": "v"} and response.usage is not None and response.usage.output_tokens > 0
    sent = provider.calls()[-1]
    assert sent["headers"]["authorization"] == f"Bearer {PROVIDER_KEY}"
    assert sent["json"]["store"] is False and sent["json"]["stream"] is True and sent["json"]["model"] == MODEL
    assert sent["json"]["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}]
    assert_no_gateway_key(provider)
    stored = await client.responses.retrieve(response.id)  # the gateway's own record, not the provider's
    assert stored.id == response.id and stored.output_text == response.output_text
    items = await client.responses.input_items.list(response.id)
    assert [item.type for item in items.data] == ["message"]


async def test_previous_response_id_and_conversations_are_expanded_into_the_upstream_input(
    gateway: httpx.AsyncClient, provider: Provider
) -> None:
    client = sdk(gateway)
    first = await client.responses.create(model=MODEL, input="one")
    second = await client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert second.output_text == "heard: one | two"
    sent = provider.calls()[-1]["json"]
    assert "previous_response_id" not in sent and all("id" not in item for item in sent["input"])
    assert [item.get("role") for item in sent["input"]] == ["user", "assistant", "user"]

    conversation = await client.conversations.create()
    await client.responses.create(model=MODEL, input="red", conversation=conversation.id)
    third = await client.responses.create(model=MODEL, input="blue", conversation=conversation.id)
    assert third.output_text == "heard: red | blue"
    assert "conversation" not in provider.calls()[-1]["json"]
    listed = await client.conversations.items.list(conversation.id, order="asc")
    assert [item.type for item in listed.data] == ["message"] * 4


async def test_function_calls_go_back_to_the_client_and_continue(gateway: httpx.AsyncClient, provider: Provider) -> None:
    client = sdk(gateway)
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    asked = await client.responses.create(model=MODEL, input='what time? [[call:get_time {"zone": "utc"}]]', tools=[tool])
    call = asked.output[-1]
    assert call.type == "function_call" and call.name == "get_time" and json.loads(call.arguments) == {"zone": "utc"}
    answered = await client.responses.create(
        model=MODEL, previous_response_id=asked.id, tools=[tool],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}],
    )  # fmt: skip
    assert answered.output_text == "tool said: 12:00"
    sent = provider.calls()[-1]["json"]
    assert [item["type"] for item in sent["input"]] == ["message", "function_call", "function_call_output"]
    assert sent["input"][1]["call_id"] == sent["input"][2]["call_id"] == call.call_id


async def test_mcp_tools_are_run_by_the_gateway_between_provider_turns(
    gateway: httpx.AsyncClient, provider: Provider, mcp_url: str
) -> None:
    tool = {"type": "mcp", "server_label": "tools", "server_url": mcp_url, "require_approval": "never", "allowed_tools": ["echo"]}
    response = await sdk(gateway).responses.create(model=MODEL, input='[[call:echo {"text": "hi"}]]', tools=[tool])  # type: ignore[list-item]
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    call = response.output[1]
    assert call.type == "mcp_call" and call.name == "echo" and call.output == "echo: hi" and call.server_label == "tools"
    assert response.output_text == "tool said: echo: hi"
    first, second = provider.calls()[-2:]
    assert [tool["name"] for tool in first["json"]["tools"]] == ["echo"] and first["json"]["tools"][0]["type"] == "function"
    assert [item["type"] for item in second["json"]["input"]] == ["message", "function_call", "function_call_output"]
    assert second["json"]["input"][2]["output"] == "echo: hi"
    assert response.usage is not None and response.usage.input_tokens > provider_usage(first)  # both turns summed


async def test_each_mcp_tool_call_is_counted_and_timed(gateway: httpx.AsyncClient, mcp_url: str) -> None:
    """gw_mcp_tool_calls_total and gw_mcp_tool_duration_seconds (spec 3) from the Responses tool loop."""
    labels = {"model": MODEL, "tool_name": "echo"}
    before = REGISTRY.get_sample_value("gw_mcp_tool_calls_total", {**labels, "result": "success"}) or 0.0
    timed = REGISTRY.get_sample_value("gw_mcp_tool_duration_seconds_count", labels) or 0.0
    tool = {"type": "mcp", "server_label": "tools", "server_url": mcp_url, "require_approval": "never", "allowed_tools": ["echo"]}
    response = await sdk(gateway).responses.create(model=MODEL, input='[[call:echo {"text": "hi"}]]', tools=[tool])  # type: ignore[list-item]
    assert response.output[1].type == "mcp_call"
    assert REGISTRY.get_sample_value("gw_mcp_tool_calls_total", {**labels, "result": "success"}) == before + 1
    assert REGISTRY.get_sample_value("gw_mcp_tool_duration_seconds_count", labels) == timed + 1


def provider_usage(request: dict[str, Any]) -> int:
    return sum(len(str(item.get("content") or "").split()) for item in request["json"]["input"])


async def test_a_streamed_response_keeps_the_event_order_and_is_stored(gateway: httpx.AsyncClient, provider: Provider) -> None:
    client = sdk(gateway)
    stream = await client.responses.create(model=MODEL, input="stream me please", stream=True)
    events = [event async for event in stream]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert sum(kind in ("response.completed", "response.failed", "response.incomplete") for kind in kinds) == 1
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 1
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == "heard: stream me please"
    final = events[-1].response
    assert (await client.responses.retrieve(final.id)).output_text == text


async def test_provider_errors(gateway: httpx.AsyncClient, provider: Provider) -> None:
    client = sdk(gateway)
    with pytest.raises(openai.BadRequestError) as refused:  # the provider's status and body, unchanged
        await client.responses.create(model=MODEL, input="hi", metadata={"provider_fail": "400"})
    assert refused.value.body == {"message": "provider failure", "type": "server_error", "param": None, "code": None}

    # The provider breaks off mid-stream. (stream_error is the spec's code, which the SDK's Literal of
    # error codes does not list: these events are read as JSON.)
    body = {"model": MODEL, "input": "a b c d e", "stream": True, "metadata": {"provider_break": "1"}}
    answer = await gateway.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["code"] == "stream_error"
    added = [event for event in events if event["type"] == "response.output_item.added"]
    done = [event for event in events if event["type"] == "response.output_item.done"]
    assert len(added) == len(done) == 1  # the open message closed once, partial text kept
    stored = await gateway.get(f"/v1/responses/{events[-1]['response']['id']}", headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
    assert stored.json()["status"] == "failed" and stored.json()["output"][0]["content"][0]["text"]


async def test_background_runs_on_the_provider(gateway: httpx.AsyncClient, provider: Provider) -> None:
    client = sdk(gateway)
    queued = await client.responses.create(model=MODEL, input="later", background=True)
    assert queued.status == "queued"

    async def done() -> bool:
        return (await client.responses.retrieve(queued.id)).status == "completed"

    await until(done)
    assert (await client.responses.retrieve(queued.id)).output_text == "heard: later"


async def test_chat_completions_are_relayed_with_only_the_worker_key(gateway: httpx.AsyncClient, provider: Provider) -> None:
    completion = await sdk(gateway).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hey"}])
    assert completion.choices[0].message.content == "heard: hey"
    assert provider.calls("/v1/chat/completions")[-1]["headers"]["authorization"] == f"Bearer {PROVIDER_KEY}"
    assert_no_gateway_key(provider)


TRACING = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "rojo=00f067aa0ba902b7"}


async def test_provider_turns_carry_the_tracing_headers_a_relay_sends(
    gateway: httpx.AsyncClient, provider: Provider, mcp_url: str
) -> None:
    client = sdk(gateway)
    extra = {**TRACING, "x-gw-routing-key": "user-7", "x-unrelated": "dropped"}
    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hey"}], extra_headers=extra)
    tool = {"type": "mcp", "server_label": "tools", "server_url": mcp_url, "require_approval": "never", "allowed_tools": ["echo"]}
    await client.responses.create(model=MODEL, input='[[call:echo {"text": "hi"}]]', tools=[tool], extra_headers=extra)  # type: ignore[list-item]
    relayed = provider.calls("/v1/chat/completions")[-1]["headers"]
    first, second = provider.calls()[-2:]  # both turns of the MCP loop
    own = {"x-request-id", "content-length", "accept"}  # the request's own id, body length and streaming
    for turn in (first, second):
        assert turn["headers"]["traceparent"] == TRACING["traceparent"] and turn["headers"]["tracestate"] == TRACING["tracestate"]
        assert "x-unrelated" not in turn["headers"]
        assert {k: v for k, v in turn["headers"].items() if k not in own} == {k: v for k, v in relayed.items() if k not in own}
    assert_no_gateway_key(provider)


async def test_in_open_mode_a_worker_without_a_key_relays_the_callers_own(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = make_gateway([external(provider, api_key=None)], ssrf_allow_loopback=True, history_backend="memory")
    response = await sdk(gateway, key=PROVIDER_KEY).responses.create(model=MODEL, input="mine")
    assert response.output_text == "heard: mine"
    assert provider.calls()[-1]["headers"]["authorization"] == f"Bearer {PROVIDER_KEY}"
    with pytest.raises(openai.AuthenticationError):  # a wrong key is the provider's 401, relayed
        await sdk(gateway, key="sk-wrong").responses.create(model=MODEL, input="mine")


async def test_the_ssrf_guard_keeps_loopback_providers_out_unless_allowed(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = make_gateway([external(provider)], api_key=GATEWAY_KEY, history_backend="memory")
    with pytest.raises(openai.InternalServerError) as refused:
        await sdk(gateway).responses.create(model=MODEL, input="hi")
    assert refused.value.status_code == 502
    with pytest.raises(openai.InternalServerError):
        await sdk(gateway).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    await asyncio.sleep(0)
    assert provider.state.requests == []


async def test_a_client_that_leaves_closes_the_provider_stream(make_gateway: GatewayFactory, provider: Provider) -> None:
    make_gateway([external(provider)], ssrf_allow_loopback=True, history_backend="memory")
    body = {"model": MODEL, "input": "one two three four five six seven eight", "stream": True,
            "metadata": {"provider_delay_ms": "40"}}  # fmt: skip
    stream = RawStream(application, body)  # leaves at the first text delta
    await asyncio.wait_for(stream.task, 10)
    assert any(event["type"] == "response.output_text.delta" for event in stream.events())

    async def closed_upstream() -> bool:
        return provider.state.disconnected == 1

    await until(closed_upstream)
