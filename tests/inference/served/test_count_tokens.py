"""POST /v1/messages/count_tokens on gRPC workers (spec 1, "Token counting"): counted by the gateway
with the model's tokenizer from exactly the prompt POST /v1/messages sends, so each count here equals
the number of prompt ids the real gRPC engine stand-in received for the same request; and the
refusals (tokenizer_not_ready, tokenizer_not_found, process_messages_failed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anthropic
from anthropic.types import MessageParam, ToolParam
import httpx2
import pytest

from gateway_project.asgi import application
from inference.pipeline.tokenizer_registry import TOKENIZERS
from tests.conftest import GatewayFactory
from tests.inference.served.conftest import QWEN_MODEL, EngineGateway, Start

WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CONVERSATION: list[MessageParam] = [
    {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "get_weather can tell.", "signature": ""},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "18 degrees"}]},
        {"type": "text", "text": "And tomorrow?"},
    ]},
]  # fmt: skip
CASES = [
    pytest.param({"messages": [{"role": "user", "content": "Hello"}]}, id="plain"),
    pytest.param(
        {"messages": CONVERSATION, "tools": [WEATHER], "thinking": {"type": "enabled", "budget_tokens": 2048}},
        id="tools-and-thinking",
    ),
    pytest.param(
        {"messages": CONVERSATION, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"},
         "thinking": {"type": "disabled"}, "system": [{"type": "text", "text": "Be brief."}]},
        id="forced-tool-thinking-off-system",
    ),  # fmt: skip
    pytest.param(
        {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}], "thinking": {"type": "adaptive"}},
        id="continued-assistant-turn",
    ),
]


async def count(gw: EngineGateway, request: dict[str, Any]) -> int:
    response = await gw.http.post("/v1/messages/count_tokens", json={"model": QWEN_MODEL, **request})
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["input_tokens"]
    return int(body["input_tokens"])


@pytest.mark.parametrize("request_fields", CASES)
async def test_the_count_is_the_prompt_the_engine_receives(start_engine_gateway: Start, request_fields: dict[str, Any]) -> None:
    gw = await start_engine_gateway()
    counted = await count(gw, request_fields)
    sent = await gw.http.post("/v1/messages", json={"model": QWEN_MODEL, "max_tokens": 16, **request_fields})
    assert sent.status_code == 200, sent.text
    assert counted == len(gw.engine.state.requests[-1].input_ids) == sent.json()["usage"]["input_tokens"]


async def test_the_sdk_reads_the_count(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url="http://gateway", timeout=30)
    client = anthropic.AsyncAnthropic(base_url="http://gateway", api_key="x", http_client=http, max_retries=0, _strict_response_validation=True)
    counted = await client.messages.count_tokens(model=QWEN_MODEL, messages=CONVERSATION, tools=[WEATHER])
    assert counted.input_tokens == await count(gw, {"messages": CONVERSATION, "tools": [WEATHER]})
    assert gw.engine.state.requests == []  # counting never reaches the engine


async def test_fields_count_tokens_does_not_read_are_accepted(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    plain = await count(gw, {"messages": [{"role": "user", "content": "Hello"}]})
    assert plain == await count(gw, {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5, "stream": True, "x": 1})


async def test_a_document_is_its_text_and_one_without_text_is_refused(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    as_text = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The sky is green."}}
    as_content = {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "The sky is green."}]}}
    plain = await count(gw, {"messages": [{"role": "user", "content": "The sky is green."}]})
    assert await count(gw, {"messages": [{"role": "user", "content": [as_text]}]}) == plain
    assert await count(gw, {"messages": [{"role": "user", "content": [as_content]}]}) == plain
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    for path in ("/v1/messages/count_tokens", "/v1/messages"):
        response = await gw.http.post(path, json={"model": QWEN_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [pdf]}]})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "process_messages_failed"
    assert gw.engine.state.requests == []


async def test_a_template_that_refuses_the_messages_is_process_messages_failed(start_engine_gateway: Start, tmp_path: Path) -> None:
    template = tmp_path / "chat_template.jinja"
    template.write_text("{% if messages[-1].role != 'user' %}{{ raise_exception('the last turn must be a user turn') }}{% endif %}x")
    gw = await start_engine_gateway(chat_template=str(template))
    body = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}
    response = await gw.http.post("/v1/messages/count_tokens", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "process_messages_failed"


async def test_a_loading_tokenizer_is_503_with_retry_after(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    TOKENIZERS.clear()
    response = await gw.http.post("/v1/messages/count_tokens", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "tokenizer_not_ready"


async def test_no_tokenizer_under_disabled_autoload_is_500(start_engine_gateway: Start, make_gateway: GatewayFactory) -> None:
    gw = await start_engine_gateway()
    assert gw.record.engine is not None
    record = dataclasses.replace(gw.record, engine=dataclasses.replace(gw.record.engine, tokenizer=None))
    http = make_gateway([record], disable_tokenizer_autoload=True)
    response = await http.post("/v1/messages/count_tokens", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 500 and response.json()["error"]["code"] == "tokenizer_not_found"
