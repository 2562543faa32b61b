"""Special tokens in a served chat's output (the gateway detokenizes): the output is decoded with
special tokens skipped, except the ones the request's tool parser reads (its markers). Mistral's
``[TOOL_CALLS]`` is a special token of its tokenizer, so a Mistral chat with tools decodes it and
the mistral parser finds the call; every other special token (the end of sequence) stays out of
the text, with or without tools."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.pipeline.tokenizers import load_tokenizer
from standins.scripted_engine import DEFAULT_TEXT, TOOL_CALL
from tests.inference.served.conftest import EngineGateway, Start
from tests.inference.served.test_thinking import MISTRAL, MISTRAL_MODEL, WEATHER_TOOL, chat, only_call, streamed

TOOL_PROMPT = "[[mock:tool_call]] weather in Paris?"


def special_texts() -> list[str]:
    tokenizer = load_tokenizer(MISTRAL)
    texts = [tokenizer.token_text(token_id) for token_id in tokenizer.special_token_ids]
    assert "[TOOL_CALLS]" in texts and "</s>" in texts
    return texts


def assert_no_special_tokens(text: str) -> None:
    assert not [special for special in special_texts() if special in text], text


async def mistral(start: Start, **options: Any) -> EngineGateway:
    return await start(model=MISTRAL_MODEL, tokenizer=MISTRAL, **options)


@pytest.mark.parametrize("chunk_tokens", [1, 3])
async def test_a_mistral_call_is_tool_calls_whole_and_streamed(start_engine_gateway: Start, chunk_tokens: int) -> None:
    gw = await mistral(start_engine_gateway, chunk_tokens=chunk_tokens)
    choice = await chat(gw, TOOL_PROMPT, model=MISTRAL_MODEL, tools=[WEATHER_TOOL])
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert only_call(choice["message"]) == TOOL_CALL["arguments"]
    stream = await streamed(gw, TOOL_PROMPT, model=MISTRAL_MODEL, tools=[WEATHER_TOOL])
    assert [(call["name"], json.loads(call["arguments"])) for call in stream["calls"]] == [
        (TOOL_CALL["name"], TOOL_CALL["arguments"])
    ]
    assert (stream["content"], stream["finish"]) == ("", ["tool_calls"])


async def test_responses_on_mistral_have_the_function_call(start_engine_gateway: Start) -> None:
    gw = await mistral(start_engine_gateway)
    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}  # type: ignore[index]
    response = await gw.sdk().responses.create(model=MISTRAL_MODEL, input=TOOL_PROMPT, tools=[tool])
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == TOOL_CALL["arguments"]


@pytest.mark.parametrize("tools", [pytest.param([WEATHER_TOOL], id="with-tools"), pytest.param(None, id="without-tools")])
async def test_plain_text_has_no_special_tokens(start_engine_gateway: Start, tools: list[Any] | None) -> None:
    """The answer ends with the end of sequence (the stop token, never decoded) with or without
    tools: the text is the reply alone."""
    gw = await mistral(start_engine_gateway, chunk_tokens=1)
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    choice = await chat(gw, "Hello", model=MISTRAL_MODEL, **extra)
    assert choice["message"]["content"] == " " + DEFAULT_TEXT and choice["finish_reason"] == "stop"
    stream = await streamed(gw, "Hello", model=MISTRAL_MODEL, **extra)
    assert stream["content"] == " " + DEFAULT_TEXT


async def test_without_tools_the_call_marker_is_skipped_as_every_special_token(start_engine_gateway: Start) -> None:
    """No tools, no tool parser: skip_special_tokens as asked (the default), so the model's call is
    plain text without its [TOOL_CALLS] marker, and no other special token either."""
    gw = await mistral(start_engine_gateway)
    choice = await chat(gw, TOOL_PROMPT, model=MISTRAL_MODEL)
    content = choice["message"]["content"]
    assert "tool_calls" not in choice["message"] and json.loads(content) == [TOOL_CALL]
    assert_no_special_tokens(content)
    stream = await streamed(gw, TOOL_PROMPT, model=MISTRAL_MODEL)
    assert stream["content"] == content
    assert_no_special_tokens(stream["content"])


async def test_skip_special_tokens_false_still_keeps_every_special_token(start_engine_gateway: Start) -> None:
    """A client that asks for special tokens gets them (the call marker in the text without tools);
    the end of sequence stays out (the stop token is never decoded)."""
    gw = await mistral(start_engine_gateway)
    content = (await chat(gw, TOOL_PROMPT, model=MISTRAL_MODEL, skip_special_tokens=False))["message"]["content"]
    assert content.lstrip().startswith("[TOOL_CALLS]") and "</s>" not in content
