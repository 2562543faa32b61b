"""POST /v1/messages on gRPC workers: the gateway is the Anthropic Messages server (spec 1,
"Messages-style API": gRPC and ZMQ handling, Response building; "Events": Messages stream; "Errors"),
read with the real anthropic SDK in strict mode (its own parser must accept every answer and event),
in front of the real gRPC engine stand-in thinking as Qwen3 does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import anthropic
from anthropic.types import MessageParam, ThinkingConfigDisabledParam, ThinkingConfigEnabledParam, ToolParam
import httpx2
import pytest

from gateway_project.asgi import application
from standins.scripted_engine import DEFAULT_TEXT, REASONING, TOOL_CALL, Thinking
from tests.inference.served.conftest import QWEN_MODEL, EngineGateway, Start

WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
}
THINKING_ON: ThinkingConfigEnabledParam = {"type": "enabled", "budget_tokens": 1024}
THINKING_OFF: ThinkingConfigDisabledParam = {"type": "disabled"}
HELLO: list[MessageParam] = [{"role": "user", "content": "Hello"}]


def sdk() -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url="http://gateway", timeout=30)
    return anthropic.AsyncAnthropic(
        base_url="http://gateway", api_key="x", http_client=http, max_retries=0, _strict_response_validation=True
    )


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event."""
    found = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: "), block
        found.append((name[7:], json.loads(data[6:])))
    return found


def sent(value: Any, key: str) -> Any:
    """The field ``key`` anywhere in the request the engine received (each runtime nests its own)."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for nested in value.values():
            found = sent(nested, key)
            if found is not None:
                return found
    return None


def prompt_ids(gw: EngineGateway) -> tuple[int, ...]:
    return gw.engine.state.requests[-1].input_ids


# --- whole answers ----------------------------------------------------------------------------------


async def test_thinking_on_answers_a_thinking_block_then_the_text(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    message = await sdk().messages.create(model=QWEN_MODEL, max_tokens=256, messages=HELLO, thinking=THINKING_ON)
    assert [block.type for block in message.content] == ["thinking", "text"]
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking == REASONING and thinking.signature == ""
    assert text.type == "text" and text.text == DEFAULT_TEXT
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.id.startswith("msg_") and message.model == QWEN_MODEL and message.role == "assistant"
    assert message.usage.input_tokens == len(prompt_ids(gw)) and message.usage.output_tokens > 0
    assert message.usage.cache_creation_input_tokens == 0 and message.usage.cache_read_input_tokens == 0
    assert gw.engine.state.requests[-1].thinking is Thinking.MODEL  # the template left the turn open


async def test_thinking_off_answers_text_only(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    message = await sdk().messages.create(model=QWEN_MODEL, max_tokens=256, messages=HELLO, thinking=THINKING_OFF)
    assert [(block.type, getattr(block, "text", None)) for block in message.content] == [("text", DEFAULT_TEXT)]
    assert gw.engine.state.requests[-1].thinking is Thinking.CLOSED  # the template closed an empty block


async def test_sampling_and_system_reach_the_engine(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {
        "model": QWEN_MODEL, "max_tokens": 77, "messages": HELLO, "system": [{"type": "text", "text": "Be brief."}],
        "temperature": 0.25, "top_p": 0.5, "top_k": 7, "thinking": THINKING_OFF,
    }  # fmt: skip
    assert (await gw.http.post("/v1/messages", json=body)).status_code == 200
    served = gw.engine.state.requests[-1]
    sampling = served.sampling["sampling_params"]
    assert sampling["max_new_tokens"] == 77 and sampling["temperature"] == 0.25 and sampling["top_p"] == 0.5
    assert sampling["top_k"] == 7 and "stop" not in sampling  # stop sequences stay with the gateway
    assert served.prompt_text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello")


async def test_max_tokens_cut_is_stop_reason_max_tokens(start_engine_gateway: Start) -> None:
    await start_engine_gateway()
    message = await sdk().messages.create(model=QWEN_MODEL, max_tokens=3, messages=HELLO, thinking=THINKING_OFF)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert message.content[0].type == "text" and DEFAULT_TEXT.startswith(message.content[0].text)


async def test_a_stop_sequence_ends_the_text_and_is_named(start_engine_gateway: Start) -> None:
    await start_engine_gateway()
    message = await sdk().messages.create(
        model=QWEN_MODEL, max_tokens=256, messages=HELLO, stop_sequences=["never", "stand-in"], thinking=THINKING_OFF,
    )  # fmt: skip
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "stand-in"
    assert message.content[0].type == "text" and message.content[0].text == DEFAULT_TEXT.split("stand-in")[0]
    async with sdk().messages.stream(
        model=QWEN_MODEL, max_tokens=256, messages=HELLO, stop_sequences=["stand-in"], thinking=THINKING_OFF,
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "stand-in"
    assert final.content[0].type == "text" and final.content[0].text == DEFAULT_TEXT.split("stand-in")[0]


# --- tools ------------------------------------------------------------------------------------------


async def test_a_tool_use_round_trip(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(reply="tool_call")
    client = sdk()
    asked: list[MessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = await client.messages.create(model=QWEN_MODEL, max_tokens=256, messages=asked, tools=[WEATHER], thinking=THINKING_ON)
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    call = message.content[-1]
    assert call.type == "tool_use" and call.id.startswith("toolu_") and not call.id.startswith("toolu_call_")
    assert call.name == TOOL_CALL["name"] and call.input == TOOL_CALL["arguments"]
    assert message.stop_reason == "tool_use"
    assert '"name": "get_weather"' in gw.engine.state.requests[-1].prompt_text  # the tool reached the template

    answered: list[MessageParam] = [
        *asked,
        {"role": "assistant", "content": message.content},  # the SDK sends its own blocks back
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees, sunny"}]},
    ]
    await client.messages.create(model=QWEN_MODEL, max_tokens=256, messages=answered, tools=[WEATHER], thinking=THINKING_ON)
    prompt = gw.engine.state.requests[-1].prompt_text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 degrees, sunny\n</tool_response>" in prompt


async def test_a_streamed_tool_use_has_the_same_id_form_and_input(start_engine_gateway: Start) -> None:
    await start_engine_gateway(reply="tool_call")
    async with sdk().messages.stream(
        model=QWEN_MODEL, max_tokens=256, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
        thinking=THINKING_ON,
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "tool_use"]
    call = final.content[-1]
    assert call.type == "tool_use" and call.id.startswith("toolu_") and call.input == TOOL_CALL["arguments"]
    assert final.stop_reason == "tool_use" and "ping" not in kinds


async def test_tool_choice_tool_is_constrained_to_that_tool(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(text='{"city": "Paris"}')
    message = await sdk().messages.create(
        model=QWEN_MODEL, max_tokens=256, messages=HELLO, tools=[WEATHER, {**WEATHER, "name": "other"}],
        tool_choice={"type": "tool", "name": "get_weather"}, thinking=THINKING_OFF,
    )  # fmt: skip
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    assert message.stop_reason == "tool_use" and call.id.startswith("toolu_")
    served = gw.engine.state.requests[-1]
    assert json.loads(sent(served.sampling, "json_schema")) == WEATHER["input_schema"]  # constrained decoding
    assert '"name": "other"' not in served.prompt_text  # only that tool goes to the template


async def test_tool_choice_any_is_constrained_to_a_call_of_the_tools(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(text='[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    message = await sdk().messages.create(
        model=QWEN_MODEL, max_tokens=256, messages=HELLO, tools=[WEATHER], tool_choice={"type": "any"},
        thinking=THINKING_OFF,
    )  # fmt: skip
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Oslo"}
    schema = json.loads(sent(gw.engine.state.requests[-1].sampling, "json_schema"))
    assert schema["type"] == "array" and schema["minItems"] == 1


async def test_tool_choice_none_and_other_tool_types_give_the_template_no_tools(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {
        "model": QWEN_MODEL, "max_tokens": 64, "messages": HELLO, "thinking": THINKING_OFF,
        "tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "none"},
    }  # fmt: skip
    response = await gw.http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    assert "<tools>" not in gw.engine.state.requests[-1].prompt_text
    await gw.http.post("/v1/messages", json={**body, "tool_choice": {"type": "auto"}})
    prompt = gw.engine.state.requests[-1].prompt_text
    assert '"name": "get_weather"' in prompt and "web_search" not in prompt


# --- rendering --------------------------------------------------------------------------------------


async def test_blocks_are_rendered_as_the_template_reads_them(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {
        "model": QWEN_MODEL, "max_tokens": 64, "thinking": THINKING_ON, "system": "You are terse.",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Read this:"},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The sky is green."}},
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "They want a summary.", "signature": "sig"},
                {"type": "text", "text": "It says the sky is green."},
            ]},
            {"role": "user", "content": "Thanks"},
        ],
    }  # fmt: skip
    response = await gw.http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    prompt = gw.engine.state.requests[-1].prompt_text
    assert prompt.startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    assert "<|im_start|>user\nRead this:\nThe sky is green.<|im_end|>" in prompt
    assert "<|im_start|>assistant\nIt says the sky is green.<|im_end|>" in prompt  # Qwen3 drops earlier thinking
    assert prompt.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")


IMAGE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for part in m.content %}{% if part.type == 'image_url' %}<image>{% else %}{{ part.text }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


async def test_an_image_is_its_template_placeholder(start_engine_gateway: Start, tmp_path: Path) -> None:
    template = tmp_path / "chat_template.jinja"
    template.write_text(IMAGE_TEMPLATE)
    gw = await start_engine_gateway(chat_template=str(template))
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this? "}, IMAGE]}]
    response = await gw.http.post("/v1/messages", json={"model": QWEN_MODEL, "max_tokens": 8, "messages": messages})
    assert response.status_code == 200, response.text
    assert "<|im_start|>user\nWhat is this? <image><|im_end|>" in gw.engine.state.requests[-1].prompt_text
    counted = await gw.http.post("/v1/messages/count_tokens", json={"model": QWEN_MODEL, "messages": messages})
    assert counted.json() == {"input_tokens": len(prompt_ids(gw))}


async def test_a_final_assistant_turn_is_continued(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    messages = [*HELLO, {"role": "assistant", "content": "Bonjour"}]
    response = await gw.http.post(
        "/v1/messages", json={"model": QWEN_MODEL, "max_tokens": 8, "messages": messages, "thinking": THINKING_OFF}
    )
    assert response.status_code == 200, response.text
    assert gw.engine.state.requests[-1].prompt_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nBonjour")


# --- the event stream -------------------------------------------------------------------------------


async def test_the_sdk_stream_parser_accepts_every_event(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    async with sdk().messages.stream(model=QWEN_MODEL, max_tokens=256, messages=HELLO, thinking=THINKING_ON) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].type == "thinking" and final.content[0].thinking == REASONING
    assert final.content[1].type == "text" and final.content[1].text == DEFAULT_TEXT
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    assert final.usage.input_tokens == len(prompt_ids(gw))
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "ping" not in kinds


async def test_the_raw_stream_in_order_with_zero_counters_first(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {"model": QWEN_MODEL, "max_tokens": 256, "messages": HELLO, "stream": True, "thinking": THINKING_ON}
    response = await gw.http.post("/v1/messages", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert b"[DONE]" not in response.content
    events = events_of(response.content)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    start = events[0][1]["message"]
    assert names[0] == "message_start" and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    starts = [data for name, data in events if name == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "thinking"), (1, "text")]
    deltas = [data["delta"]["type"] for name, data in events if name == "content_block_delta"]
    assert set(deltas) == {"thinking_delta", "text_delta"}
    assert [data["index"] for name, data in events if name == "content_block_stop"] == [0, 1]
    assert names[-2:] == ["message_delta", "message_stop"]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["input_tokens"] == len(prompt_ids(gw)) and delta["usage"]["output_tokens"] > 0
    assert delta["usage"]["cache_creation_input_tokens"] == 0 and delta["usage"]["cache_read_input_tokens"] == 0


async def test_an_engine_failure_after_the_stream_started_is_the_error_event(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=30)
    body = {"model": QWEN_MODEL, "max_tokens": 256, "messages": HELLO, "stream": True}
    call = asyncio.create_task(gw.http.post("/v1/messages", json=body))
    for _ in range(200):
        if gw.engine.state.requests and gw.engine.state.requests[-1].outputs.get(0):
            break
        await asyncio.sleep(0.01)
    await gw.engine.stop(grace=0)
    events = events_of((await call).content)
    assert events[0][0] == "message_start"
    name, data = events[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "message_stop" not in [name for name, _ in events]


# --- refusals before dispatch -----------------------------------------------------------------------


async def test_a_context_overflow_is_400_before_the_stream(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(context_length=8)
    for stream in (False, True):
        body = {"model": QWEN_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi " * 20}], "stream": stream}
        response = await gw.http.post("/v1/messages", json=body)
        assert response.status_code == 400 and response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] is None
    assert gw.engine.state.requests == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop_sequences": ["END"]}, "stop_sequences"),
        ({"tools": [WEATHER], "tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": [IMAGE]}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}]}]}, "messages"),
    ],
)
async def test_mlx_refuses_stop_sequences_forced_tools_and_images(start_engine_gateway: Start, extra: dict[str, Any], param: str) -> None:
    gw = await start_engine_gateway(runtime="mlx")
    body = {"model": QWEN_MODEL, "max_tokens": 8, "messages": HELLO, **extra}
    response = await gw.http.post("/v1/messages", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == 400 and response.json()["error"]["param"] == param
    assert gw.engine.state.requests == []
    plain = await gw.http.post("/v1/messages", json={"model": QWEN_MODEL, "max_tokens": 8, "messages": HELLO, "tools": [WEATHER]})
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize("runtime", ["vllm", "trtllm", "tokenspeed"])
async def test_the_other_runtimes_take_stop_sequences_and_forced_tools(start_engine_gateway: Start, runtime: str) -> None:
    gw = await start_engine_gateway(runtime=runtime)
    base = {"model": QWEN_MODEL, "max_tokens": 64, "messages": HELLO, "thinking": THINKING_OFF}
    stopped = await gw.http.post("/v1/messages", json={**base, "stop_sequences": ["stand-in"]})
    assert stopped.status_code == 200, stopped.text
    assert (stopped.json()["stop_reason"], stopped.json()["stop_sequence"]) == ("stop_sequence", "stand-in")
    forced = await gw.http.post("/v1/messages", json={**base, "tools": [WEATHER], "tool_choice": {"type": "any"}})
    assert forced.status_code == 200, forced.text
    received = gw.engine.state.requests[-1].sampling
    schema = sent(received, "json_schema") or sent(received, "guide")  # TensorRT-LLM's guided_decoding
    assert json.loads(schema)["minItems"] == 1  # constrained decoding


@pytest.mark.parametrize("extra", [{"max_tokens": 2**40}, {"top_k": 2**40}], ids=["max_tokens", "top_k"])
async def test_a_value_past_the_engines_range_is_400_not_500(start_engine_gateway: Start, extra: dict[str, Any]) -> None:
    gw = await start_engine_gateway()
    for stream in (False, True):
        body = {"model": QWEN_MODEL, "max_tokens": 8, "messages": HELLO, "stream": stream, **extra}
        response = await gw.http.post("/v1/messages", json=body)
        assert response.status_code == 400 and response.json()["error"]["code"] == 400, response.text
    assert gw.engine.state.requests == []
