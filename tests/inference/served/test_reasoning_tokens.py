"""usage's reasoning tokens on served answers (spec 1, chat usage: completion_tokens_details
.reasoning_tokens, present when non-zero; spec 2, Responses usage: output_tokens_details
.reasoning_tokens): the gateway counts the output tokens of the reasoning block as they stream, in
SGLang's meaning (from the start of the output through the token that closes the block). The
expected counts come from the fixture tokenizer: the stand-in's reasoning part, tokenized."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.pipeline.tokenizers import load_tokenizer
from standins.fixtures import FIXTURE_MODELS
from standins.scripted_engine import REASONING, THINK_END, THINK_START, TOOL_REASONING
from tests.inference.served.conftest import QWEN, QWEN_MODEL, EngineGateway, Start
from tests.inference.served.test_thinking import DEEPSEEK, THINKING_OFF, WEATHER_TOOL, user

R1_DISTILL_MODEL = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
R1_DISTILL_TEMPLATE = str(FIXTURE_MODELS / "deepseek-r1" / "chat_template.deepseek-r1-distill.jinja")


def reasoning_part(tokenizer: str, text: str, *, opened_by_prompt: bool = False) -> list[int]:
    """The tokens of the stand-in's reasoning part: its <think> block (the model opens it), or the
    reasoning and </think> after a prompt that opened it."""
    part = f"{text}\n{THINK_END}" if opened_by_prompt else f"{THINK_START}\n{text}\n{THINK_END}"
    return load_tokenizer(tokenizer).encode(part)


def sent(gw: EngineGateway) -> list[int]:
    """The token ids the engine sent for the last request's first choice."""
    return gw.engine.state.requests[-1].outputs[0]


async def whole_usage(gw: EngineGateway, text: str, model: str = QWEN_MODEL, **body: Any) -> dict[str, Any]:
    response = await gw.http.post("/v1/chat/completions", json={"model": model, "messages": user(text), **body})
    assert response.status_code == 200, response.text
    return dict(response.json()["usage"])


async def streamed_usage(gw: EngineGateway, text: str, model: str = QWEN_MODEL, **body: Any) -> dict[str, Any]:
    payload = {"model": model, "messages": user(text), "stream": True, "stream_options": {"include_usage": True}, **body}
    raw = (await gw.http.post("/v1/chat/completions", json=payload)).content.decode()
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: ") and e != "data: [DONE]"]
    last = chunks[-1]
    assert last["choices"] == [] and all(chunk.get("usage") is None for chunk in chunks[:-1])
    return dict(last["usage"])


@pytest.mark.parametrize("chunk_tokens", [1, 4])
async def test_chat_counts_the_reasoning_block_whole_and_streamed(start_engine_gateway: Start, chunk_tokens: int) -> None:
    gw = await start_engine_gateway(chunk_tokens=chunk_tokens)
    expected = reasoning_part(QWEN, REASONING)
    usage = await whole_usage(gw, "Hello")
    assert sent(gw)[: len(expected)] == expected  # the reasoning part begins the answer
    assert usage["completion_tokens_details"] == {"reasoning_tokens": len(expected)}
    assert usage["completion_tokens"] > len(expected)  # the answer after the block is not reasoning
    usage = await streamed_usage(gw, "Hello")
    assert usage["completion_tokens_details"] == {"reasoning_tokens": len(expected)}


async def test_a_tool_call_after_reasoning_counts_the_block(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=3)
    expected = len(reasoning_part(QWEN, TOOL_REASONING))
    usage = await whole_usage(gw, "[[mock:tool_call]] weather?", tools=[WEATHER_TOOL])
    assert usage["completion_tokens_details"] == {"reasoning_tokens": expected}
    usage = await streamed_usage(gw, "[[mock:tool_call]] weather?", tools=[WEATHER_TOOL])
    assert usage["completion_tokens_details"] == {"reasoning_tokens": expected}


async def test_a_block_the_prompt_opened_is_counted_from_the_first_token(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(model=R1_DISTILL_MODEL, tokenizer=DEEPSEEK, chat_template=R1_DISTILL_TEMPLATE)
    expected = reasoning_part(DEEPSEEK, REASONING, opened_by_prompt=True)
    usage = await whole_usage(gw, "Hello", model=R1_DISTILL_MODEL)
    assert sent(gw)[: len(expected)] == expected
    assert usage["completion_tokens_details"] == {"reasoning_tokens": len(expected)}
    usage = await streamed_usage(gw, "Hello", model=R1_DISTILL_MODEL)
    assert usage["completion_tokens_details"] == {"reasoning_tokens": len(expected)}


async def test_an_answer_cut_inside_the_block_is_all_reasoning(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=2)
    usage = await whole_usage(gw, "Hello", max_tokens=5)
    assert usage["completion_tokens"] == 5 and usage["completion_tokens_details"] == {"reasoning_tokens": 5}


async def test_thinking_off_has_no_reasoning_tokens(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1)
    usage = await whole_usage(gw, "Hello", **THINKING_OFF)
    assert usage["completion_tokens"] > 0 and "completion_tokens_details" not in usage
    usage = await streamed_usage(gw, "Hello", **THINKING_OFF)
    assert "completion_tokens_details" not in usage


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_responses_report_the_reasoning_tokens(start_engine_gateway: Start, stream: bool) -> None:
    gw = await start_engine_gateway(chunk_tokens=4)
    expected = len(reasoning_part(QWEN, REASONING))
    sdk = gw.sdk()
    cases: list[tuple[dict[str, Any], int]] = [({}, expected), ({"reasoning": {"effort": "none"}}, 0)]
    for extra, reasoning_tokens in cases:
        if stream:
            events = [event async for event in await sdk.responses.create(model=QWEN_MODEL, input="Hello", stream=True, **extra)]
            completed = events[-1]
            assert completed.type == "response.completed"
            response = completed.response
        else:
            response = await sdk.responses.create(model=QWEN_MODEL, input="Hello", **extra)
        assert response.usage is not None and response.usage.output_tokens > reasoning_tokens
        assert response.usage.output_tokens_details.reasoning_tokens == reasoning_tokens
