"""POST /v1/responses on a gRPC worker: the gateway's chat pipeline, read with the openai SDK in strict
mode (objects and stream events), with the event order spec 2 gives."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Iterator

import openai
import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone
from mcp.server.mcpserver import MCPServer

from inference.routing.workers import EngineSpec, WorkerRecord, WorkerStatus, WorkerType
from responses_api import background
from responses_api.ids import new_response_id
from responses_api.models import StoredResponse
from responses_api.storage import db as storage_db
from responses_api.storage.db import DatabaseHistoryStore
from responses_api.to_chat import ToolNames, chat_messages
from standins.scripted_engine import DEFAULT_TEXT, REASONING, TOOL_CALL
from tests.conftest import GatewayFactory
from tests.inference.mcp.servers import serving
from tests.inference.served.conftest import QWEN_MODEL, Start, asgi_app, start_engine_gateway  # noqa: F401

PARSERS = {"tool_parser": "qwen", "reasoning_parser": "qwen3"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
}


def sse_events(raw: bytes) -> list[dict]:
    events = []
    for block in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            event = json.loads(lines["data"])
            assert lines["event"] == event["type"]
            events.append(event)
    return events


async def test_text_response(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    response = await gw.sdk().responses.create(model=QWEN_MODEL, input="[[mock:reasoning]] Hello", instructions="Be brief.")
    assert response.status == "completed" and response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == DEFAULT_TEXT
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text == REASONING
    assert response.usage is not None and response.usage.input_tokens == len(gw.engine.state.requests[-1].input_ids)
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    prompt = gw.engine.state.requests[-1].prompt_text
    assert prompt.startswith("<|im_start|>system\nBe brief.") and "Hello" in prompt


async def test_function_call_returns_to_the_client(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    response = await gw.sdk().responses.create(
        model=QWEN_MODEL, input="[[mock:tool_call]] weather?", tools=[WEATHER], reasoning={"effort": "none"},
        extra_body={},
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == TOOL_CALL["arguments"]
    assert call.status == "completed" and call.call_id


async def test_namespace_members_are_shown_with_their_namespace(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    tools = [{"type": "namespace", "name": "weather", "description": "d", "tools": [{**WEATHER}]}]
    body = {"model": QWEN_MODEL, "input": "hi", "tools": tools, "reasoning": {"effort": "none"}}
    assert (await gw.http.post("/v1/responses", json=body)).status_code == 200
    assert '"weather.get_weather"' in gw.engine.state.requests[-1].prompt_text


async def test_stream_events_in_order(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS, chunk_tokens=2)
    stream = await gw.sdk().responses.create(model=QWEN_MODEL, input="[[mock:reasoning]] Hello", stream=True)
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 2
    first_message = types.index("response.output_text.delta")
    assert types.index("response.reasoning_text.delta") < first_message
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == DEFAULT_TEXT
    assert events[-1].response.output_text == DEFAULT_TEXT


async def test_max_output_tokens_is_incomplete(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    # Thinking off: the cut falls in the message (with thinking on it falls in the reasoning).
    body = {"model": QWEN_MODEL, "input": "hi", "max_output_tokens": 16, "stream": True, "reasoning": {"effort": "none"}}
    events = sse_events((await gw.http.post("/v1/responses", json=body)).content)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    message = events[-1]["response"]["output"][-1]
    assert message["status"] == "incomplete"
    assert b"[DONE]" not in (await gw.http.post("/v1/responses", json=body)).content


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"input": "hi", "surprise": 1}, "json_parse_error"),
        ({"input": "hi", "max_output_tokens": 8}, 400),
        ({"input": "hi", "conversation": "abc"}, "invalid_conversation_id"),
        ({"input": "hi", "conversation": "conv_1", "previous_response_id": "resp_1"}, "mutually_exclusive_parameters"),
        ({"input": "hi", "reasoning": {"effort": "huge"}}, "json_parse_error"),
        ({"input": "hi", "tools": [{"type": "local_shell"}]}, "tool_not_supported"),
        ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": []}]}, "invalid_type"),
        ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, 400),
        ({"input": ""}, 400),
        ({"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, 400),
        ({"input": "hi", "tool_choice": "required"}, 400),
    ],
)
async def test_bad_requests_get_the_spec_errors(start_engine_gateway: Start, body: dict, code: object) -> None:
    gw = await start_engine_gateway()
    response = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code
    assert gw.engine.state.requests == []


# --- MCP tools run by the gateway ----------------------------------------------------------------------

def weather_server(answer: str) -> MCPServer:
    server = MCPServer("weather")

    @server.tool(description="Weather in a city.")
    def get_weather(city: str, unit: str = "celsius") -> str:
        return f"{answer} in {city} ({unit})"

    return server


@pytest.fixture
def mcp_url() -> Iterator[str]:
    # The tool's answer carries the stand-in's text marker, so the turn after it answers in text.
    with serving(weather_server("sunny [[mock:text]]")) as url:
        yield url


@pytest.fixture
def looping_mcp_url() -> Iterator[str]:
    with serving(weather_server("cloudy")) as url:
        yield url


LOOPBACK = {"ssrf_allow_loopback": True}


def mcp_tool(url: str) -> dict:
    return {"type": "mcp", "server_label": "weather", "server_url": url, "require_approval": "never"}


async def test_mcp_tools_run_by_the_gateway(start_engine_gateway: Start, mcp_url: str) -> None:
    gw = await start_engine_gateway(**PARSERS, gateway=LOOPBACK)
    response = await gw.sdk().responses.create(
        model=QWEN_MODEL, input="[[mock:tool_call]] weather?", tools=[mcp_tool(mcp_url)], reasoning={"effort": "none"},
    )
    assert response.status == "completed", response.error
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"]
    listing, call, message = response.output
    assert listing.type == "mcp_list_tools" and [tool.name for tool in listing.tools] == ["get_weather"]
    assert call.type == "mcp_call" and call.status == "completed" and call.server_label == "weather"
    assert call.output == "sunny [[mock:text]] in Paris (celsius)"
    assert response.output_text == DEFAULT_TEXT
    assert len(gw.engine.state.requests) == 2  # two model turns
    assert "sunny" in gw.engine.state.requests[-1].prompt_text  # the result went back to the model
    assert response.usage is not None
    assert response.usage.input_tokens == sum(len(r.input_ids) for r in gw.engine.state.requests)


async def test_the_request_timeout_bounds_each_turn_not_the_tool_rounds_after_it(start_engine_gateway: Start) -> None:
    """--request-timeout-secs bounds each turn's engine generation (D104); the first turn's deadline
    ends when its generation was read, so a tool round and the turn after it, longer together than
    the timeout, still complete the response (stored, not left in progress)."""
    server = MCPServer("weather")

    @server.tool(description="Weather in a city.")
    async def get_weather(city: str, unit: str = "celsius") -> str:
        await asyncio.sleep(1.5)  # longer than the request timeout below
        return f"sunny [[mock:text]] in {city} ({unit})"

    with serving(server) as url:
        gw = await start_engine_gateway(**PARSERS, gateway={**LOOPBACK, "request_timeout_secs": 1.0})
        response = await gw.sdk().responses.create(
            model=QWEN_MODEL, input="[[mock:tool_call]] weather?", tools=[mcp_tool(url)], reasoning={"effort": "none"},
        )
    assert response.status == "completed", response.error
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert (await gw.sdk().responses.retrieve(response.id)).status == "completed"


async def test_mcp_stream_events(start_engine_gateway: Start, mcp_url: str) -> None:
    gw = await start_engine_gateway(**PARSERS, gateway=LOOPBACK)
    stream = await gw.sdk().responses.create(
        model=QWEN_MODEL, input="[[mock:tool_call]] weather?", tools=[mcp_tool(mcp_url)], stream=True,
        reasoning={"effort": "none"},
    )
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert types[-1] == "response.completed"
    for kind in ("response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed", "response.mcp_call.in_progress",
                 "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done", "response.mcp_call.completed"):
        assert types.count(kind) == 1, kind
    assert "response.function_call_arguments.delta" not in types
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 3


async def test_max_tool_calls_completes_with_the_calls_that_ran(start_engine_gateway: Start, looping_mcp_url: str) -> None:
    gw = await start_engine_gateway(**PARSERS, gateway=LOOPBACK)
    body = {"model": QWEN_MODEL, "input": "[[mock:tool_call]] weather?", "tools": [mcp_tool(looping_mcp_url)],
            "max_tool_calls": 2, "reasoning": {"effort": "none"}}
    response = (await gw.http.post("/v1/responses", json=body)).json()
    assert response["status"] == "completed"
    assert [item["type"] for item in response["output"]].count("mcp_call") == 2


async def test_the_internal_cap_fails_the_response(start_engine_gateway: Start, looping_mcp_url: str) -> None:
    gw = await start_engine_gateway(**PARSERS, gateway=LOOPBACK)
    body = {"model": QWEN_MODEL, "input": "[[mock:tool_call]] weather?", "tools": [mcp_tool(looping_mcp_url)],
            "reasoning": {"effort": "none"}}
    response = (await gw.http.post("/v1/responses", json=body)).json()
    assert response["status"] == "failed" and response["error"]["code"] == "max_tool_calls_exceeded"
    assert [item["type"] for item in response["output"]].count("mcp_call") == 10


async def test_unreachable_or_refused_mcp_server_is_424(start_engine_gateway: Start, mcp_url: str) -> None:
    gw = await start_engine_gateway(**PARSERS)  # loopback not allowed: the guard refuses the server
    body = {"model": QWEN_MODEL, "input": "hi", "tools": [mcp_tool(mcp_url)]}
    response = await gw.http.post("/v1/responses", json=body)
    assert response.status_code == 424 and response.json()["error"]["code"] == "connect_mcp_server_failed"
    allowed = await start_engine_gateway(**PARSERS, gateway=LOOPBACK)
    dead = {**body, "tools": [mcp_tool("http://127.0.0.1:9/mcp")]}
    response = await allowed.http.post("/v1/responses", json=dead)
    assert response.status_code == 424
    assert allowed.engine.state.requests == []


# --- stored responses ------------------------------------------------------------------------------------

async def test_stored_response_retrieve_input_items_and_delete(start_engine_gateway: Start, backend: str) -> None:
    gw = await start_engine_gateway(gateway={"history_backend": backend})
    sdk = gw.sdk()
    created = await sdk.responses.create(model=QWEN_MODEL, input="Hello", metadata={"team": "a"})
    again = await sdk.responses.retrieve(created.id)
    assert again.id == created.id and again.status == "completed" and again.output_text == DEFAULT_TEXT
    assert again.metadata == {"team": "a"}
    items = await sdk.responses.input_items.list(created.id)
    assert [item.type for item in items.data] == ["message"] and items.data[0].id.startswith("msg_")
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.responses.cancel(created.id)
    assert refused.value.code == "cancellation_not_supported"
    await sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(created.id)
    missing = await gw.http.post("/v1/responses/resp_nope/cancel")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "response_not_found"


async def test_store_false_keeps_nothing(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    created = await gw.sdk().responses.create(model=QWEN_MODEL, input="Hello", store=False)
    assert (await gw.http.get(f"/v1/responses/{created.id}")).status_code == 404


async def test_previous_response_id_continues_the_history(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    sdk = gw.sdk()
    first = await sdk.responses.create(model=QWEN_MODEL, input="My name is Ada.")
    await sdk.responses.create(model=QWEN_MODEL, input="What is my name?", previous_response_id=first.id)
    prompt = gw.engine.state.requests[-1].prompt_text
    assert prompt.index("My name is Ada.") < prompt.index(DEFAULT_TEXT) < prompt.index("What is my name?")
    response = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "x", "previous_response_id": "resp_none"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


async def test_a_conversation_collects_the_items(start_engine_gateway: Start, backend: str) -> None:
    gw = await start_engine_gateway(gateway={"history_backend": backend})
    sdk = gw.sdk()
    conversation = await sdk.conversations.create()
    # Thinking off: each turn is one message each way (with thinking on a reasoning item comes first).
    await sdk.responses.create(model=QWEN_MODEL, input="first", conversation=conversation.id, reasoning={"effort": "none"})
    await sdk.responses.create(model=QWEN_MODEL, input="second", conversation=conversation.id, reasoning={"effort": "none"})
    prompt = gw.engine.state.requests[-1].prompt_text
    assert prompt.index("first") < prompt.index("second")
    items = await sdk.conversations.items.list(conversation.id, order="asc")
    assert [item.type for item in items.data] == ["message", "message", "message", "message"]


async def test_responses_are_scoped_to_their_tenant(start_engine_gateway: Start) -> None:
    keys = {"tenant_api_keys": (("acme", "sk-acme"), ("globex", "sk-globex"))}
    gw = await start_engine_gateway(gateway=keys)
    acme = {"Authorization": "Bearer sk-acme"}
    globex = {"Authorization": "Bearer sk-globex"}
    created = (await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi"}, headers=acme)).json()
    assert (await gw.http.get(f"/v1/responses/{created['id']}", headers=acme)).status_code == 200
    for method, path in (("GET", ""), ("GET", "/input_items"), ("DELETE", "")):
        answer = await gw.http.request(method, f"/v1/responses/{created['id']}{path}", headers=globex)
        assert answer.status_code == 404, (method, path)
    cancel = await gw.http.post(f"/v1/responses/{created['id']}/cancel", headers=globex)
    assert cancel.status_code == 404 and cancel.json()["error"]["code"] == "response_not_found"
    assert (await gw.http.get(f"/v1/responses/{created['id']}")).status_code == 401


# --- background mode ----------------------------------------------------------------------------------

async def _poll(gw, response_id: str, *statuses: str) -> dict:
    for _ in range(300):
        found = (await gw.http.get(f"/v1/responses/{response_id}")).json()
        if found.get("status") in statuses:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"{response_id} never reached {statuses}: {found}")


async def test_background_returns_the_queued_object_then_completes(start_engine_gateway: Start, backend: str) -> None:
    gw = await start_engine_gateway(gateway={"history_backend": backend})
    queued = await gw.sdk().responses.create(model=QWEN_MODEL, input="Hello", background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    items = await gw.sdk().responses.input_items.list(queued.id)
    assert [item.type for item in items.data] == ["message"]  # readable from the first poll
    done = await _poll(gw, queued.id, "completed")
    assert done["output"][-1]["content"][0]["text"] == DEFAULT_TEXT and done["usage"]["output_tokens"] > 0


async def test_cancel_stops_a_background_run(
    start_engine_gateway: Start, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(background, "CANCEL_POLL_SECS", 0.05)
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=100, gateway={"history_backend": backend})
    queued = (await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "background": True})).json()
    await _poll(gw, queued["id"], "in_progress")
    cancelled = await gw.sdk().responses.cancel(queued["id"])
    assert cancelled.status == "cancelled"
    again = await gw.sdk().responses.cancel(queued["id"])  # cancelling again returns the object again
    assert again.status == "cancelled"
    for _ in range(200):
        if gw.engine.state.aborted_ids():
            break
        await asyncio.sleep(0.02)
    assert gw.engine.state.aborted_ids() == [queued["id"]]  # the run stopped and the engine was told
    await asyncio.sleep(0.1)
    assert (await gw.http.get(f"/v1/responses/{queued['id']}")).json()["status"] == "cancelled"


async def test_a_background_run_holds_a_concurrency_permit_while_it_runs(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=40, gateway={"max_concurrent_requests": 1, "queue_size": 0})
    queued = (await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "background": True})).json()
    await _poll(gw, queued["id"], "in_progress")
    chat = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "x"}]}
    # The run holds the one permit: a foreground request finds none (no queue: 429 at once).
    refused = await gw.http.post("/v1/chat/completions", json=chat)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "admission_queue_full"
    assert (await _poll(gw, queued["id"], "completed"))["output"][-1]["content"][0]["text"] == DEFAULT_TEXT
    assert (await gw.http.post("/v1/chat/completions", json=chat)).status_code == 200  # the run gave it back


async def test_background_limit_and_background_off(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=50, gateway={"max_background_responses": 1})
    first = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "background": True})
    assert first.status_code == 200
    second = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "background": True})
    assert second.status_code == 429 and second.json()["error"]["code"] == "background_responses_limit_reached"
    completed = await _poll(gw, first.json()["id"], "completed")
    with pytest.raises(openai.BadRequestError) as refused:
        await gw.sdk().responses.cancel(completed["id"])
    assert refused.value.code == "response_already_completed"
    off = await start_engine_gateway(gateway={"max_background_responses": 0})
    answer = (await off.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "background": True})).json()
    assert answer["status"] == "completed"  # run in the foreground


async def test_a_streamed_background_response_reports_queued_then_runs(start_engine_gateway: Start, backend: str) -> None:
    gw = await start_engine_gateway(chunk_tokens=2, gateway={"history_backend": backend})
    stream = await gw.sdk().responses.create(model=QWEN_MODEL, input="Hello", background=True, stream=True)
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0].response.status == "queued" and events[1].response.status == "queued"
    assert events[0].response.background is True
    assert types[-1] == "response.completed" and types.count("response.completed") == 1
    assert [event.sequence_number for event in events] == list(range(len(events)))
    stored = await _poll(gw, events[0].response.id, "completed")
    assert stored["output"][-1]["content"][0]["text"] == DEFAULT_TEXT


class RawStream:
    """POST /v1/responses straight into the ASGI app (httpx's ASGI transport buffers whole answers):
    ``delta`` is set at the first output_text delta; the client disconnects once ``leave`` is set
    (by default: at that first delta)."""

    def __init__(self, asgi_app: object, body: dict, *, leave_at_delta: bool = True) -> None:
        self.seen = bytearray()
        self.delta = asyncio.Event()
        self.ended = asyncio.Event()
        self.leave = self.delta if leave_at_delta else self.ended
        self._requests = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/responses", "raw_path": b"/v1/responses", "query_string": b"", "root_path": "",
            "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
        }  # fmt: skip
        self.task = asyncio.ensure_future(asgi_app(scope, self._receive, self._send))  # type: ignore[operator]

    async def _receive(self) -> dict:
        if self._requests:
            return self._requests.pop()
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        if message["type"] == "http.response.body":
            self.seen.extend(message.get("body", b""))
            if b"response.output_text.delta" in self.seen:
                self.delta.set()
            if not message.get("more_body", False):
                self.ended.set()

    def events(self) -> list[dict]:
        """The whole events received (a last one cut off by the disconnect left out)."""
        return sse_events(bytes(self.seen).rsplit(b"\n\n", 1)[0] + b"\n\n")


async def test_a_streamed_background_run_outlives_its_client(
    start_engine_gateway: Start, backend: str, asgi_app: object
) -> None:
    """The client leaves after the first events: the run goes on to completed and is stored."""
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=20, gateway={"history_backend": backend})
    stream = RawStream(asgi_app, {"model": QWEN_MODEL, "input": "Hello", "background": True, "stream": True})
    await asyncio.wait_for(stream.task, 10)
    events = stream.events()
    assert events[0]["type"] == "response.created" and "response.completed" not in [e["type"] for e in events]
    done = await _poll(gw, events[0]["response"]["id"], "completed")
    assert done["output"][-1]["content"][0]["text"] == DEFAULT_TEXT
    assert not gw.engine.state.aborted_ids()  # the disconnect did not stop generation


async def test_cancelling_a_streamed_background_run_ends_its_stream_without_a_terminal_event(
    start_engine_gateway: Start, monkeypatch: pytest.MonkeyPatch, asgi_app: object
) -> None:
    monkeypatch.setattr(background, "CANCEL_POLL_SECS", 0.05)
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=50)
    body = {"model": QWEN_MODEL, "input": "hi", "background": True, "stream": True}
    stream = RawStream(asgi_app, body, leave_at_delta=False)
    await asyncio.wait_for(stream.delta.wait(), 10)
    response_id = stream.events()[0]["response"]["id"]
    assert (await gw.http.post(f"/v1/responses/{response_id}/cancel")).json()["status"] == "cancelled"
    await asyncio.wait_for(stream.task, 10)  # the stream ends
    types = [event["type"] for event in sse_events(bytes(stream.seen))]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert not {"response.completed", "response.failed", "response.incomplete"} & set(types)
    assert (await gw.http.get(f"/v1/responses/{response_id}")).json()["status"] == "cancelled"


async def test_shutdown_stores_running_background_responses_as_failed(start_engine_gateway: Start, backend: str) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=100, gateway={"history_backend": backend})
    queued = (await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "background": True})).json()
    await _poll(gw, queued["id"], "in_progress")
    await background.BACKGROUND.aclose()
    stored = (await gw.http.get(f"/v1/responses/{queued['id']}")).json()
    assert stored["status"] == "failed" and "stopped" in stored["error"]["message"]
    assert len(background.BACKGROUND) == 0


async def test_an_unstored_background_result_is_deleted_after_a_while(
    start_engine_gateway: Start, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(background, "UNSTORED_KEEP_SECS", 0.2)
    gw = await start_engine_gateway(gateway={"history_backend": backend})
    body = {"model": QWEN_MODEL, "input": "hi", "background": True, "store": False}
    queued = (await gw.http.post("/v1/responses", json=body)).json()
    assert (await _poll(gw, queued["id"], "completed"))["store"] is False  # readable while it is kept
    for _ in range(100):
        if (await gw.http.get(f"/v1/responses/{queued['id']}")).status_code == 404:
            break
        await asyncio.sleep(0.05)
    assert (await gw.http.get(f"/v1/responses/{queued['id']}")).status_code == 404


@pytest.mark.django_db(transaction=True)
async def test_a_background_response_whose_process_is_gone_reads_as_failed(start_engine_gateway: Start) -> None:
    """A queued or in-progress row nobody marked for RUN_STALE_SECS (its process was killed) is
    stored and answered as failed; cancelling it is then 400 response_already_failed."""
    gw = await start_engine_gateway(gateway={"history_backend": "db"})
    abandoned = response_shell_for_test(status="in_progress")
    await DatabaseHistoryStore().asave_response("open", abandoned, [])
    await sync_to_async(
        lambda: StoredResponse.objects.filter(pk=abandoned["id"]).update(
            updated_at=timezone.now() - timedelta(seconds=background.RUN_STALE_SECS + 5)
        )
    )()
    found = (await gw.http.get(f"/v1/responses/{abandoned['id']}")).json()
    assert found["status"] == "failed" and found["error"]["code"] == "server_error"
    assert "stopped" in found["error"]["message"]
    refused = await gw.http.post(f"/v1/responses/{abandoned['id']}/cancel")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "response_already_failed"


@pytest.mark.django_db(transaction=True)
async def test_a_long_background_run_keeps_its_response_alive(
    start_engine_gateway: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run marks its row every HEARTBEAT_SECS, so a run longer than RUN_STALE_SECS is not taken
    for an abandoned one."""
    monkeypatch.setattr(background, "CANCEL_POLL_SECS", 0.05)
    monkeypatch.setattr(background, "HEARTBEAT_SECS", 0.1)
    monkeypatch.setattr(storage_db, "RUN_STALE_SECS", 0.5)
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=60, gateway={"history_backend": "db"})
    queued = (await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "background": True})).json()
    seen = set()
    for _ in range(400):
        status = (await gw.http.get(f"/v1/responses/{queued['id']}")).json()["status"]
        seen.add(status)
        if status not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.05)
    assert status == "completed" and "failed" not in seen and "in_progress" in seen


def response_shell_for_test(status: str) -> dict:
    return {"id": new_response_id(), "object": "response", "created_at": 1, "status": status, "model": QWEN_MODEL,
            "output": [], "background": True, "store": True}


async def test_encrypted_reasoning_is_included_on_request_and_replayed(start_engine_gateway: Start) -> None:
    """include reasoning.encrypted_content: reasoning items carry the blob; a store: false client
    sends the item back with the blob alone and the model sees that reasoning again."""
    gw = await start_engine_gateway(**PARSERS)
    first = await gw.sdk().responses.create(
        model=QWEN_MODEL, input="[[mock:reasoning]] Hello", store=False, include=["reasoning.encrypted_content"]
    )
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    plain = await gw.sdk().responses.create(model=QWEN_MODEL, input="[[mock:reasoning]] Hello", store=False)
    assert plain.output[0].type == "reasoning" and plain.output[0].encrypted_content is None
    replay = [
        {"type": "message", "role": "user", "content": "Hello"},
        {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content},
        {"type": "message", "role": "assistant", "content": first.output_text},
        {"type": "message", "role": "user", "content": "And then?"},
    ]
    await gw.sdk().responses.create(model=QWEN_MODEL, input=replay, store=False)
    prompt = gw.engine.state.requests[-1].prompt_text
    assert prompt.count("<|im_start|>assistant") == 2 and "And then?" in prompt
    # (Qwen3's template drops the reasoning of turns before the last user message; the chat messages
    # built from the replay carry it.)
    messages = chat_messages(None, replay, ToolNames())
    assert messages[1] == {"role": "assistant", "content": first.output_text, "reasoning_content": REASONING}
    bad = {**replay[1], "encrypted_content": "not-a-blob"}
    refused = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": [replay[0], bad, *replay[2:]]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[1].encrypted_content"


async def test_item_references_in_the_input_are_the_stored_items(start_engine_gateway: Start, backend: str) -> None:
    gw = await start_engine_gateway(gateway={"history_backend": backend})
    first = await gw.sdk().responses.create(model=QWEN_MODEL, input="Remember the word: marmalade")
    (user_item,) = (await gw.sdk().responses.input_items.list(first.id)).data
    answer_item = first.output[-1]
    second = await gw.sdk().responses.create(
        model=QWEN_MODEL,
        input=[{"type": "item_reference", "id": user_item.id}, {"type": "item_reference", "id": answer_item.id},
               {"type": "message", "role": "user", "content": "Which word?"}],
    )
    prompt = gw.engine.state.requests[-1].prompt_text
    assert "marmalade" in prompt and DEFAULT_TEXT in prompt and "Which word?" in prompt
    listed = (await gw.sdk().responses.input_items.list(second.id, order="asc")).data
    assert [item.id for item in listed][:2] == [user_item.id, answer_item.id]  # stored as the items themselves
    missing = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": [{"type": "item_reference", "id": "msg_nope"}]})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "input"


async def test_with_history_backend_none_a_streamed_background_run_is_not_taken_for_cancelled(
    start_engine_gateway: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is stored, so the run's cancel watch finds nothing: that is not a cancel (spec 2: the
    queued object is returned, nothing can be polled or cancelled), and the stream runs to its end."""
    monkeypatch.setattr(background, "CANCEL_POLL_SECS", 0.05)
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=30, gateway={"history_backend": "none"})
    stream = await gw.sdk().responses.create(model=QWEN_MODEL, input="Hello", background=True, stream=True)
    events = [event async for event in stream]
    assert events[1].type == "response.queued" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == DEFAULT_TEXT
    assert not gw.engine.state.aborted_ids()


async def test_an_epd_deployment_answers_501(make_gateway: GatewayFactory) -> None:
    encoder = WorkerRecord(
        id="epd-encoder", url="grpc://127.0.0.1:1", model_id=QWEN_MODEL, runtime_type="sglang", status=WorkerStatus.READY,
        worker_type=WorkerType.ENCODE, engine=EngineSpec(),
    )  # fmt: skip
    http = make_gateway([encoder], history_backend="memory")
    response = await http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi"})
    assert response.status_code == 501 and response.json()["error"]["code"] == "endpoint_not_supported"
