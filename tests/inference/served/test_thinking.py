"""The gRPC stand-in answers as the model it stands in for, and the gateway reads it (issue 21, item 3).

A thinking model (Qwen3 with thinking on, DeepSeek R1) writes ``<think>`` reasoning ``</think>`` and
then its answer; with thinking off its template closes an empty block and the model just answers.
Through the gateway (the parsers registration would choose for the model's family) that is
``reasoning_content`` plus ``content`` or ``tool_calls`` in chat, whole and streamed, and a
reasoning item plus a message or a function_call in Responses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from standins.fixtures import FIXTURE_MODELS
from standins.scripted_engine import DEFAULT_TEXT, REASONING, TOOL_CALL, TOOL_REASONING, Thinking
from tests.inference.served.conftest import LLAMA, LLAMA_MODEL, QWEN_MODEL, EngineGateway, Start

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
    },
}
THINKING_OFF: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}
MODES = [pytest.param({}, id="thinking-on"), pytest.param(THINKING_OFF, id="thinking-off")]
MISTRAL, MISTRAL_MODEL = str(FIXTURE_MODELS / "mistral"), "mistralai/Mistral-7B-Instruct-v0.3"
DEEPSEEK, DEEPSEEK_MODEL = str(FIXTURE_MODELS / "deepseek-r1"), "deepseek-ai/DeepSeek-R1"


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def chat(gw: EngineGateway, text: str, model: str = QWEN_MODEL, **body: Any) -> dict[str, Any]:
    response = await gw.http.post("/v1/chat/completions", json={"model": model, "messages": user(text), **body})
    assert response.status_code == 200, response.text
    return dict(response.json()["choices"][0])


async def streamed(gw: EngineGateway, text: str, model: str = QWEN_MODEL, **body: Any) -> dict[str, Any]:
    """The streamed answer's deltas put together: reasoning, content, tool calls and finish."""
    payload = {"model": model, "messages": user(text), "stream": True, **body}
    raw = (await gw.http.post("/v1/chat/completions", json=payload)).content.decode()
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: ") and e != "data: [DONE]"]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        for call in delta["delta"].get("tool_calls") or []:
            entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            entry["name"] += call.get("function", {}).get("name") or ""
            entry["arguments"] += call.get("function", {}).get("arguments") or ""
    return {
        "reasoning": "".join(d["delta"].get("reasoning_content") or "" for d in deltas),
        "content": "".join(d["delta"].get("content") or "" for d in deltas),
        "calls": list(calls.values()),
        "finish": [d["finish_reason"] for d in deltas if d["finish_reason"]],
    }


def only_call(message: dict[str, Any]) -> dict[str, Any]:
    (call,) = message.get("tool_calls") or []
    assert call["function"]["name"] == TOOL_CALL["name"]
    return dict(json.loads(call["function"]["arguments"]))


async def test_a_plain_hello_with_thinking_on_has_reasoning_then_content(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    choice = await chat(gw, "Hello")
    assert choice["message"]["content"] == DEFAULT_TEXT and choice["message"]["reasoning_content"] == REASONING
    assert choice["finish_reason"] == "stop"
    assert gw.engine.state.requests[-1].thinking is Thinking.MODEL  # the template left the turn open
    stream = await streamed(gw, "Hello")
    assert (stream["reasoning"], stream["content"], stream["finish"]) == (REASONING, DEFAULT_TEXT, ["stop"])


async def test_a_plain_hello_with_thinking_off_is_content_only(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    message = (await chat(gw, "Hello", **THINKING_OFF))["message"]
    assert message["content"] == DEFAULT_TEXT and "reasoning_content" not in message
    assert gw.engine.state.requests[-1].thinking is Thinking.CLOSED
    stream = await streamed(gw, "Hello", **THINKING_OFF)
    assert (stream["reasoning"], stream["content"]) == ("", DEFAULT_TEXT)


@pytest.mark.parametrize("mode", MODES)
async def test_a_scripted_tool_call_is_tool_calls_in_both_thinking_modes(start_engine_gateway: Start, mode: dict) -> None:
    gw = await start_engine_gateway(chunk_tokens=1)
    reasoning = TOOL_REASONING if not mode else None
    choice = await chat(gw, "[[mock:tool_call]] weather in Paris?", tools=[WEATHER_TOOL], **mode)
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert only_call(choice["message"]) == TOOL_CALL["arguments"]
    assert choice["message"].get("reasoning_content") == reasoning
    stream = await streamed(gw, "[[mock:tool_call]] weather in Paris?", tools=[WEATHER_TOOL], **mode)
    assert [(call["name"], json.loads(call["arguments"])) for call in stream["calls"]] == [
        (TOOL_CALL["name"], TOOL_CALL["arguments"])
    ]
    assert (stream["reasoning"] or None, stream["content"], stream["finish"]) == (reasoning, "", ["tool_calls"])


async def test_responses_show_the_reasoning_and_the_text(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    response = await gw.sdk().responses.create(model=QWEN_MODEL, input="Hello")
    assert response.output_text == DEFAULT_TEXT
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text == REASONING


@pytest.mark.parametrize("effort", [None, "none"], ids=["thinking-on", "thinking-off"])
async def test_responses_function_call_in_both_thinking_modes(start_engine_gateway: Start, effort: str | None) -> None:
    gw = await start_engine_gateway()
    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}  # type: ignore[index]
    extra: dict[str, Any] = {"reasoning": {"effort": effort}} if effort else {}
    response = await gw.sdk().responses.create(model=QWEN_MODEL, input="[[mock:tool_call]] weather?", tools=[tool], **extra)
    kinds = [item.type for item in response.output]
    assert kinds == (["function_call"] if effort else ["reasoning", "function_call"])
    call = response.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == TOOL_CALL["arguments"]


LLAMA3 = pytest.param(LLAMA_MODEL, LLAMA, {}, Thinking.NONE, None, id="llama3")
R1 = pytest.param(DEEPSEEK_MODEL, DEEPSEEK, {}, Thinking.MODEL, REASONING, id="deepseek-r1")
R1_DISTILL = pytest.param(
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", DEEPSEEK,
    {"chat_template": str(FIXTURE_MODELS / "deepseek-r1" / "chat_template.deepseek-r1-distill.jinja")},
    Thinking.OPENED, REASONING, id="deepseek-r1-distill",
)  # fmt: skip
FAMILY = ("model", "tokenizer", "options", "thinking", "reasoning")


@pytest.mark.parametrize(
    FAMILY, [LLAMA3, pytest.param(MISTRAL_MODEL, MISTRAL, {}, Thinking.NONE, None, id="mistral"), R1, R1_DISTILL]
)
async def test_other_families_answer_in_their_own_form(
    start_engine_gateway: Start, model: str, tokenizer: str, options: dict, thinking: Thinking, reasoning: str | None
) -> None:
    gw = await start_engine_gateway(model=model, tokenizer=tokenizer, **options)
    message = (await chat(gw, "Hello", model=model))["message"]
    # SentencePiece (Mistral): the reply's first piece is "▁Hello", a space after the prompt, as
    # vLLM and SGLang give it.
    lead = " " if model == MISTRAL_MODEL else ""
    assert message["content"] == lead + DEFAULT_TEXT and message.get("reasoning_content") == reasoning
    assert gw.engine.state.requests[-1].thinking is thinking
    assert gw.engine.state.requests[-1].prompt_matches


# Mistral's [TOOL_CALLS] is a special token of its tokenizer, decoded because the mistral parser
# reads it (tests/inference/served/test_special_tokens.py).
MISTRAL_FAMILY = pytest.param(MISTRAL_MODEL, MISTRAL, {}, Thinking.NONE, None, id="mistral")


@pytest.mark.parametrize(FAMILY, [LLAMA3, MISTRAL_FAMILY, R1, R1_DISTILL])
async def test_other_families_call_tools_in_their_own_form(
    start_engine_gateway: Start, model: str, tokenizer: str, options: dict, thinking: Thinking, reasoning: str | None
) -> None:
    gw = await start_engine_gateway(model=model, tokenizer=tokenizer, **options)
    choice = await chat(gw, "[[mock:tool_call]] weather?", model=model, tools=[WEATHER_TOOL])
    assert choice["finish_reason"] == "tool_calls" and only_call(choice["message"]) == TOOL_CALL["arguments"]
    assert choice["message"].get("reasoning_content") == (TOOL_REASONING if reasoning else None)
    assert gw.engine.state.requests[-1].thinking is thinking
