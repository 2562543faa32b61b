"""The external-provider stand-in (standins.mock_provider), served for real on loopback and driven by the
openai SDK in strict response-validation mode and by raw aiohttp requests. No database; asyncio_mode = auto."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from standins.mock_provider import ProviderConfig, ProviderState, build_provider_app, provider_state
from tests.conftest import serving_provider

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-provider-test"
MODEL = "gpt-4o-mini"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


@dataclass
class Provider:
    url: str
    state: ProviderState


@pytest_asyncio.fixture
async def provider() -> AsyncIterator[Provider]:
    app = build_provider_app(ProviderConfig())
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield Provider(f"http://127.0.0.1:{runner.addresses[0][1]}", provider_state(app))
    await runner.cleanup()


def sdk_client(url: str, api_key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, _strict_response_validation=True, max_retries=0)


@pytest_asyncio.fixture
async def sdk(provider: Provider) -> AsyncIterator[openai.AsyncOpenAI]:
    client = sdk_client(provider.url)
    yield client
    await client.close()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def post(http: aiohttp.ClientSession, url: str, body: Any, key: str = KEY) -> tuple[int, Any]:
    async with http.post(url, json=body, headers=auth(key)) as response:
        return response.status, await response.json(content_type=None)


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of every ``event:``/``data:`` block."""
    events = []
    for block in raw.decode().split("\n\n"):
        if block:
            name_line, data_line = block.split("\n")
            assert name_line.startswith("event: ") and data_line.startswith("data: "), block
            events.append((name_line[7:], orjson.loads(data_line[6:])))
    return events


# --- models and the request log -----------------------------------------------------------------


async def test_models_list(sdk: openai.AsyncOpenAI) -> None:
    page = await sdk.models.list()
    assert [(m.id, m.object, m.created, m.owned_by) for m in page.data] == [
        ("gpt-4o-mini", "model", 1700000000, "mock-provider"),
        ("gpt-4.1", "model", 1700000000, "mock-provider"),
    ]
    assert (await sdk.models.retrieve("gpt-4.1")).id == "gpt-4.1"
    with pytest.raises(openai.NotFoundError):
        await sdk.models.retrieve("gpt-5")


async def test_request_log_in_process_and_over_http(
    provider: Provider, sdk: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await sdk.responses.create(model=MODEL, input="hi")
    (entry,) = provider.state.requests
    assert entry["method"] == "POST" and entry["path"] == "/v1/responses"
    assert entry["headers"]["authorization"] == f"Bearer {KEY}"
    assert entry["json"] == {"model": MODEL, "input": "hi"}
    async with http.get(f"{provider.url}/_provider/requests") as response:  # no auth, not recorded
        assert response.status == 200 and await response.json() == [entry]
    async with http.delete(f"{provider.url}/_provider/requests") as response:
        assert response.status == 200
    assert provider.state.requests == []
    for _ in range(205):
        provider.state.record({"method": "GET", "path": "/x", "headers": {}, "json": None})
    assert len(provider.state.requests) == 200


# --- /v1/responses ------------------------------------------------------------------------------


async def test_responses_plain(sdk: openai.AsyncOpenAI) -> None:
    conversation: list[Any] = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "how are you"}]},
    ]
    result = await sdk.responses.create(
        model=MODEL,
        input=conversation,
        store=False,
        metadata={"k": "v"},
    )
    assert result.id.startswith("resp_") and result.object == "response" and result.status == "completed"
    assert result.output_text == "heard: hello there | how are you"
    (message,) = result.output
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "completed"
    assert result.model_extra is not None and result.model_extra["store"] is False  # not a field of the SDK's Response
    assert result.metadata == {"k": "v"} and result.completed_at is not None
    assert result.tool_choice == "auto" and result.tools == [] and result.parallel_tool_calls is True
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.total_tokens) == (6, 7, 13)
    assert result.usage.input_tokens_details.cached_tokens == 0


async def test_responses_instructions(sdk: openai.AsyncOpenAI) -> None:
    result = await sdk.responses.create(model="gpt-4.1", input="ping", instructions="be brief")
    assert result.output_text == "[be brief] heard: ping"
    assert result.instructions == "be brief" and result.model == "gpt-4.1"
    assert result.usage is not None and result.usage.input_tokens == 3


async def test_responses_function_call(sdk: openai.AsyncOpenAI) -> None:
    result = await sdk.responses.create(
        model=MODEL,
        input='weather? [[call:get_weather {"city": "Paris"}]] [[call:unknown {}]] '
        '[[call:get_weather {"city": "Oslo"}]]',
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert [item.type for item in result.output] == ["function_call", "function_call"]
    first, second = result.output
    assert first.type == "function_call" and second.type == "function_call"
    assert first.id is not None and first.id.startswith("fc_") and first.call_id.startswith("call_")
    assert (first.name, first.arguments, first.status) == ("get_weather", '{"city": "Paris"}', "completed")
    assert second.arguments == '{"city": "Oslo"}' and second.call_id != first.call_id
    assert result.usage is not None and result.usage.output_tokens == 10
    assert result.tools[0].type == "function" and result.tools[0].name == "get_weather"
    # No such tool in the request: the marker is plain text.
    plain = await sdk.responses.create(model=MODEL, input='[[call:get_weather {"city": "Paris"}]]')
    assert plain.output_text == 'heard: [[call:get_weather {"city": "Paris"}]]'


async def test_responses_function_call_output(sdk: openai.AsyncOpenAI) -> None:
    result = await sdk.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C and sunny"},
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert result.output_text == "tool said: 18C and sunny"
    parts = await sdk.responses.create(
        model=MODEL,
        input=[
            {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "rain"}]},
        ],
    )
    assert parts.output_text == "tool said: rain"


async def test_responses_stream(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.responses.create(model=MODEL, input="one two three", stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created = events[0]
    assert created.type == "response.created" and created.response.status == "in_progress"
    assert created.response.output == [] and created.response.usage is None
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    terminal = events[-1]
    assert terminal.type == "response.completed"
    assert deltas == terminal.response.output_text == "heard: one two three"
    assert sum(e.type in ("response.completed", "response.incomplete", "response.failed") for e in events) == 1


async def test_responses_stream_function_call(provider: Provider, http: aiohttp.ClientSession) -> None:
    body = {"model": MODEL, "input": '[[call:get_weather {"city": "Rome"}]]', "tools": [WEATHER_TOOL], "stream": True}
    async with http.post(f"{provider.url}/v1/responses", json=body, headers=auth()) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await response.read())
    assert all(name == data["type"] for name, data in events)
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = events[2][1]["item"], events[6][1]["item"]
    assert added["status"] == "in_progress" and added["arguments"] == ""
    assert "".join(data["delta"] for name, data in events if name.endswith("arguments.delta")) == done["arguments"]
    assert events[5][1]["name"] == "get_weather" and events[5][1]["arguments"] == '{"city": "Rome"}'


async def test_responses_incomplete_at_max_output_tokens(sdk: openai.AsyncOpenAI) -> None:
    long_input = " ".join(f"w{i}" for i in range(40))
    result = await sdk.responses.create(model=MODEL, input=long_input, max_output_tokens=16)
    assert result.status == "incomplete" and result.completed_at is None
    assert result.incomplete_details is not None and result.incomplete_details.reason == "max_output_tokens"
    assert result.output_text == "heard: " + " ".join(f"w{i}" for i in range(15))
    assert result.output[0].type == "message" and result.output[0].status == "incomplete"
    assert result.usage is not None and result.usage.output_tokens == 16 and result.usage.input_tokens == 40
    stream = await sdk.responses.create(model=MODEL, input=long_input, max_output_tokens=16, stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == result.output_text


async def test_auth_required(provider: Provider, http: aiohttp.ClientSession) -> None:
    async with sdk_client(provider.url, api_key="sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.responses.create(model=MODEL, input="hi")
    assert caught.value.status_code == 401
    assert caught.value.body == {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    async with http.get(f"{provider.url}/v1/models") as response:
        assert response.status == 401
    assert [r["headers"].get("authorization") for r in provider.state.requests] == ["Bearer sk-wrong", None]


async def test_responses_refusals(sdk: openai.AsyncOpenAI, provider: Provider, http: aiohttp.ClientSession) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert caught.value.code == "unsupported_parameter" and caught.value.param == "previous_response_id"
    with_id: list[Any] = [{"id": "msg_1", "type": "message", "role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.responses.create(model=MODEL, input=with_id)
    assert caught.value.code == "invalid_value" and caught.value.param == "input"
    with pytest.raises(openai.NotFoundError) as not_found:
        await sdk.responses.create(model="gpt-5", input="hi")
    assert not_found.value.code == "model_not_found"
    url = f"{provider.url}/v1/responses"
    cases: list[tuple[dict[str, Any], str | None, str | None]] = [
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
        ({"input": [{"type": "web_search_call"}]}, "input", "invalid_value"),
        ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]}, "input", None),
        ({"max_output_tokens": 8}, "max_output_tokens", "integer_below_min_value"),
    ]
    for extra, param, code in cases:
        status, body = await post(http, url, {"model": MODEL, "input": "hi", **extra})
        assert status == 400 and body["error"]["param"] == param and body["error"]["code"] == code, (extra, body)
    status, body = await post(http, url, {"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c"}]})
    assert body["error"]["message"] == "No tool call found for function call output with call_id c."
    status, body = await post(http, url, {"model": MODEL, "input": "hi", "background": False, "store": False})
    assert status == 200


async def test_provider_fail_and_break(
    provider: Provider, sdk: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk.responses.create(model="nope", input="hi", metadata={"provider_fail": "500"})
    assert caught.value.body == {"message": "provider failure", "type": "server_error", "param": None, "code": None}
    status, _ = await post(http, f"{provider.url}/v1/chat/completions", {"metadata": {"provider_fail": "429"}})
    assert status == 429
    body = {"model": MODEL, "input": "a b c d", "stream": True, "metadata": {"provider_break": "1"}}
    raw = b""
    async with http.post(f"{provider.url}/v1/responses", json=body, headers=auth()) as response:
        try:
            async for chunk in response.content.iter_any():
                raw += chunk
        except aiohttp.ClientPayloadError:
            pass  # the connection closed in the middle of the chunked body
    names = [name for name, _ in sse_events(raw)]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]


# --- /v1/chat/completions -----------------------------------------------------------------------


async def test_chat_completion(sdk: openai.AsyncOpenAI) -> None:
    result = await sdk.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "bye now"}]},
        ],
    )
    assert result.id.startswith("chatcmpl-") and result.object == "chat.completion" and result.model == MODEL
    (choice,) = result.choices
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    assert choice.message.content == "heard: hello there | bye now"
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (7, 6)
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "x"}])


async def test_chat_completion_stream(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "one two"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "heard: one two" and len(chunks) == 1 + 3 + 1 + 1
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


async def test_chat_stream_raw_framing(provider: Provider, http: aiohttp.ClientSession) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with http.post(f"{provider.url}/v1/chat/completions", json=body, headers=auth()) as response:
        raw = (await response.read()).decode()
    blocks = raw.split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""] and all(b.startswith("data: ") for b in blocks[:-1])
    assert orjson.loads(blocks[-3][6:])["choices"][0]["finish_reason"] == "stop"


# --- configuration, command, process ------------------------------------------------------------


def test_config_validation() -> None:
    assert ProviderConfig(models=["a"]).models == ("a",)  # type: ignore[arg-type]
    for bad in ({"models": ()}, {"models": ("",)}, {"api_key": ""}):
        with pytest.raises(ValueError):
            ProviderConfig(**bad)


def test_management_command_parses_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management.base import CommandError

    from standins.management.commands import runmockprovider

    calls: list[tuple[ProviderConfig, str, int]] = []
    monkeypatch.setattr(
        runmockprovider, "run_mock_provider", lambda config, host, port: calls.append((config, host, port))
    )
    command = runmockprovider.Command()
    parser = command.create_parser("manage.py", "runmockprovider")
    command.handle(**vars(parser.parse_args(["--port", "0"])))
    argv = ["--host", "0.0.0.0", "--port", "8080", "--model", "m1", "--model", "m2", "--api-key", "sk-x"]
    command.handle(**vars(parser.parse_args(argv)))
    assert calls == [
        (ProviderConfig(), "127.0.0.1", 0),
        (ProviderConfig(models=("m1", "m2"), api_key="sk-x"), "0.0.0.0", 8080),
    ]
    with pytest.raises(CommandError, match="--port"):
        command.handle(**vars(parser.parse_args(["--port", "70000"])))


async def test_run_mock_provider_serves_and_announces(http: aiohttp.ClientSession) -> None:
    code = (
        "from standins.mock_provider import ProviderConfig, run_mock_provider; "
        "run_mock_provider(ProviderConfig(models=('m1',), api_key='k'), '127.0.0.1', 0)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, cwd=REPO, env=env, stdout=PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        prefix = "mock provider serving m1 on http://127.0.0.1:"
        assert line.startswith(prefix), line
        async with http.get(f"http://127.0.0.1:{int(line[len(prefix):])}/v1/models", headers=auth("k")) as response:
            assert (await response.json())["data"][0]["id"] == "m1"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0


async def test_each_flavour_checks_its_own_key_header_and_answers_its_own_list_shape() -> None:
    claude_models = tuple(f"claude-{i}" for i in range(25))
    async with (
        serving_provider(ProviderConfig(models=claude_models, api_key=KEY, flavour="anthropic")) as claude,
        serving_provider(ProviderConfig(models=("gemini-2.5-flash",), api_key=KEY, flavour="gemini")) as gemini,
        serving_provider(ProviderConfig(models=("grok-4",), api_key=KEY, flavour="xai")) as grok,
        aiohttp.ClientSession() as http,
    ):
        bearer = {"Authorization": f"Bearer {KEY}"}
        async with http.get(f"{claude.url}/v1/models", headers=bearer) as refused:
            assert refused.status == 401 and (await refused.json())["error"]["type"] == "authentication_error"
        async with http.get(f"{claude.url}/v1/models", headers={"x-api-key": KEY}) as unversioned:
            assert unversioned.status == 400
        anthropic_headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
        async with http.get(f"{claude.url}/v1/models", headers=anthropic_headers) as page:
            body = await page.json()
        assert [m["id"] for m in body["data"]] == list(claude_models[:20]) and body["has_more"] is True
        assert body["data"][0]["type"] == "model" and body["first_id"] == "claude-0" and body["last_id"] == "claude-19"
        async with http.get(f"{claude.url}/v1/models?limit=1000", headers=anthropic_headers) as whole:
            assert len((await whole.json())["data"]) == 25
        async with http.get(f"{gemini.url}/v1/models", headers={"x-goog-api-key": KEY}) as not_bearer:
            assert not_bearer.status == 401
        async with http.get(f"{gemini.url}/v1/models", headers=bearer) as listed:
            assert (await listed.json())["data"] == [
                {"id": "models/gemini-2.5-flash", "object": "model", "created": 0, "owned_by": "google"}
            ]
        async with http.get(f"{grok.url}/v1/models", headers=bearer) as listed:
            assert [(m["id"], m["owned_by"]) for m in (await listed.json())["data"]] == [("grok-4", "xai")]
        async with http.post(f"{grok.url}/v1/interactions", headers=bearer, json={"model": "grok-4", "input": "hi"}) as absent:
            assert absent.status == 404  # Gemini's API only
