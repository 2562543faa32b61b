"""POST /v1/chat/completions on a gRPC worker: the gateway renders, tokenizes, drives the engine
stand-in and builds the answer itself; read through the openai SDK in strict mode."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import orjson
import pytest

from inference.dataplane import data_plane
from inference.pipeline.tokenizer_registry import TOKENIZERS
from standins.scripted_engine import DEFAULT_TEXT, REASONING, TOOL_CALL
from tests.conftest import free_port
from tests.inference.served.conftest import LLAMA, LLAMA_MODEL, QWEN_MODEL, Start

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
PARSERS = {"tool_parser": "qwen", "reasoning_parser": "qwen3"}
# Thinking off: the answer is the call or text alone (with thinking on the stand-in reasons first, as
# Qwen3 does; tests/inference/served/test_thinking.py covers both modes).
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def sse(raw: bytes) -> list[str]:
    return [event[6:] for event in raw.decode().split("\n\n") if event.startswith("data: ")]


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
async def test_plain_answer_with_usage(start_engine_gateway: Start, runtime: str) -> None:
    gw = await start_engine_gateway(runtime)
    answer = await gw.sdk().chat.completions.create(model=QWEN_MODEL, messages=user("Hello there"))
    assert answer.object == "chat.completion"
    assert answer.model == QWEN_MODEL
    assert answer.choices[0].message.content == DEFAULT_TEXT
    assert answer.choices[0].finish_reason == "stop"
    served = gw.engine.state.requests[-1]
    assert served.prompt_matches  # the ids decode back to the rendered prompt
    assert "Hello there" in served.prompt_text and served.prompt_text.startswith("<|im_start|>user")
    assert served.request_id == answer.id and answer.id.startswith("chatcmpl-")
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(served.input_ids)
    assert answer.usage.completion_tokens == len(served.outputs[0])
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


async def test_sampling_reaches_the_engine_as_sent_with_neutral_defaults(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    await gw.http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": user("hi")})
    defaults = gw.engine.state.requests[-1].sampling["sampling_params"]
    assert defaults["temperature"] == 1.0 and defaults["top_p"] == 1.0 and defaults["top_k"] == -1
    assert defaults["repetition_penalty"] == 1.0 and defaults["skip_special_tokens"] is True
    body = {
        "model": QWEN_MODEL, "messages": user("hi"), "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "max_completion_tokens": 50,
        "min_tokens": 2, "stop_token_ids": [13], "seed": 7, "regex": "[a-z]+",
    }
    response = await gw.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    seen = gw.engine.state.requests[-1].sampling["sampling_params"]
    assert seen["temperature"] == pytest.approx(0.5) and seen["top_p"] == pytest.approx(0.9)
    assert seen["top_k"] == 20 and seen["min_p"] == pytest.approx(0.1)
    assert seen["presence_penalty"] == pytest.approx(0.5) and seen["frequency_penalty"] == pytest.approx(-0.5)
    assert seen["repetition_penalty"] == pytest.approx(1.1)
    assert seen["max_new_tokens"] == 50 and seen["min_new_tokens"] == 2
    assert seen["stop_token_ids"] == [13]
    assert seen["regex"] == "[a-z]+"


async def test_stream_with_include_usage(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    stream = await gw.sdk().chat.completions.create(
        model=QWEN_MODEL, messages=user("Hello"), stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == DEFAULT_TEXT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(gw.engine.state.requests[-1].outputs[0])
    assert all(c.usage is None for c in chunks[:-1])


async def test_continuous_usage_stats_on_every_chunk(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {
        "model": QWEN_MODEL, "messages": user("Hello"), "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    response = await gw.http.post("/v1/chat/completions", json=body)
    events = sse(response.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(chunk["usage"]["prompt_tokens"] > 0 for chunk in chunks)
    completions = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert completions == sorted(completions) and completions[-1] > completions[0]


async def test_tool_call_is_parsed(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    answer = await gw.sdk().chat.completions.create(
        model=QWEN_MODEL, messages=user("[[mock:tool_call]] weather in Paris?"), tools=[WEATHER_TOOL], extra_body=NO_THINKING
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == TOOL_CALL["arguments"]
    assert call.id.startswith("call_")
    assert "get_weather" in gw.engine.state.requests[-1].prompt_text  # the tools reached the template


async def test_tool_call_streamed(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    stream = await gw.sdk().chat.completions.create(
        model=QWEN_MODEL, messages=user("[[mock:tool_call]] weather?"), tools=[WEATHER_TOOL], stream=True,
        extra_body=NO_THINKING,
    )
    chunks = [chunk async for chunk in stream]
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function is not None and calls[0].function.name == "get_weather" and calls[0].id
    arguments = "".join(call.function.arguments or "" for call in calls if call.function is not None)
    assert json.loads(arguments) == TOOL_CALL["arguments"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


async def test_llama_tool_call(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(model=LLAMA_MODEL, tokenizer=LLAMA, tool_parser="llama")
    answer = await gw.sdk().chat.completions.create(
        model=LLAMA_MODEL, messages=user("[[mock:tool_call]] weather?"), tools=[WEATHER_TOOL]
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == TOOL_CALL["arguments"]
    assert gw.engine.state.requests[-1].prompt_matches


async def test_reasoning_is_separated(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    answer = await gw.sdk().chat.completions.create(model=QWEN_MODEL, messages=user("[[mock:reasoning]] hi"))
    message = answer.choices[0].message
    assert message.content == DEFAULT_TEXT
    assert message.model_extra is not None and message.model_extra["reasoning_content"] == REASONING


async def test_reasoning_streamed_without_markers(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS, chunk_tokens=1)
    body = {"model": QWEN_MODEL, "messages": user("[[mock:reasoning]] hi"), "stream": True}
    chunks = [json.loads(e) for e in sse((await gw.http.post("/v1/chat/completions", json=body)).content)[:-1]]
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert reasoning == REASONING and content == DEFAULT_TEXT
    assert all("<think>" not in (c["choices"][0]["delta"].get("reasoning_content") or "") for c in chunks)


async def test_separate_reasoning_false_keeps_the_markers(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    body = {"model": QWEN_MODEL, "messages": user("[[mock:reasoning]] hi"), "separate_reasoning": False}
    message = (await gw.http.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]
    assert "<think>" in message["content"] and "reasoning_content" not in message


async def test_thinking_off_reaches_the_template(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(**PARSERS)
    body = {"model": QWEN_MODEL, "messages": user("hi"), "chat_template_kwargs": {"enable_thinking": False}}
    assert (await gw.http.post("/v1/chat/completions", json=body)).status_code == 200
    assert gw.engine.state.requests[-1].prompt_text.rstrip().endswith("</think>")


async def test_n_choices_count_the_prompt_once(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.sdk().chat.completions.create(model=QWEN_MODEL, messages=user("hi"), n=3)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(c.message.content == DEFAULT_TEXT for c in answer.choices)
    served = gw.engine.state.requests[-1]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(served.input_ids)
    assert answer.usage.completion_tokens == sum(len(served.outputs[i]) for i in range(3))


async def test_a_stream_ending_at_end_of_sequence_lets_the_engine_end_it(start_engine_gateway: Start) -> None:
    """The gateway sees the end-of-sequence token one message before the engine's own end: it reads
    on for that end instead of aborting a request that was finishing anyway (n > 1 too)."""
    gw = await start_engine_gateway(chunk_tokens=1)
    for n in (1, 2):
        body = {"model": QWEN_MODEL, "messages": user("hi"), "stream": True, "n": n}
        answer = await gw.http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
        assert '"finish_reason":"stop"' in answer.text
    await asyncio.sleep(0.2)
    assert gw.engine.state.aborted_ids() == []


async def test_stop_string_trims_and_aborts_the_engine(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=5)
    body = {"model": QWEN_MODEL, "messages": user("hi"), "stop": ["stand-in"]}
    choice = (await gw.http.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert choice["message"]["content"] == DEFAULT_TEXT.split("stand-in")[0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == "stand-in"
    served = gw.engine.state.requests[-1]
    assert served.stream  # streamed from the engine so the match could stop it
    for _ in range(100):
        if served.request_id in gw.engine.state.aborted_ids():
            break
        await asyncio.sleep(0.02)
    assert gw.engine.state.aborted_ids().count(served.request_id) == 1


async def test_no_stop_trim_keeps_the_stop_string(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {"model": QWEN_MODEL, "messages": user("hi"), "stop": "stand-in", "no_stop_trim": True, "stream": True}
    chunks = [json.loads(e) for e in sse((await gw.http.post("/v1/chat/completions", json=body)).content)[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == DEFAULT_TEXT.split("stand-in")[0] + "stand-in"


async def test_max_tokens_ends_with_length(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.sdk().chat.completions.create(model=QWEN_MODEL, messages=user("hi"), max_completion_tokens=3)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 3


async def test_logprobs(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.sdk().chat.completions.create(  # thinking off: the 4 tokens are all content
        model=QWEN_MODEL, messages=user("hi"), logprobs=True, top_logprobs=2, max_completion_tokens=4,
        extra_body=NO_THINKING,
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and len(logprobs.content) == 4
    first = logprobs.content[0]
    assert len(first.top_logprobs) == 2 and first.top_logprobs[0].token == first.token
    assert "".join(item.token for item in logprobs.content) == answer.choices[0].message.content


async def test_context_overflow_is_400(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(context_length=8)
    response = await gw.http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": user("hi " * 20)})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] is None
    assert response.headers["x-gw-error-code"] == "context_length_exceeded"
    assert gw.engine.state.requests == []


async def test_tokenizer_loading_is_503_then_served(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    TOKENIZERS.clear()
    first = await gw.http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": user("hi")})
    assert first.status_code == 503
    assert first.headers["retry-after"] == "1" and first.json()["error"]["code"] == "tokenizer_not_ready"
    for _ in range(200):
        response = await gw.http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": user("hi")})
        if response.status_code == 200:
            break
        await asyncio.sleep(0.05)
    assert response.status_code == 200


async def test_unsupported_content_part_is_400(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    response = await gw.http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": messages})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_content_part"


async def test_engine_failure_mid_stream_is_the_error_frame(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=30)
    body = {"model": QWEN_MODEL, "messages": user("hi"), "stream": True}
    call = asyncio.create_task(gw.http.post("/v1/chat/completions", json=body))
    for _ in range(200):
        if gw.engine.state.requests and gw.engine.state.requests[-1].outputs.get(0):
            break
        await asyncio.sleep(0.01)
    await gw.engine.stop(grace=0)
    events = sse((await call).content)
    assert events[-1] == "[DONE]"
    error = orjson.loads(events[-2])["error"]
    assert error["type"] == "internal_error" and error["message"]


async def test_client_disconnect_aborts_the_engine_request(start_engine_gateway: Start, asgi_app: object) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, delay_ms=20)
    body = httpx.Request("POST", "http://gateway", json={"model": QWEN_MODEL, "messages": user("hi"), "stream": True}).content
    first_chunk = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await first_chunk.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and b"content" in message.get("body", b""):
            first_chunk.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
    }
    await asyncio.wait_for(asgi_app(scope, receive, send), 5)  # type: ignore[operator]
    served = gw.engine.state.requests[-1]
    for _ in range(100):
        if served.request_id in gw.engine.state.aborted_ids():
            break
        await asyncio.sleep(0.02)
    assert gw.engine.state.aborted_ids().count(served.request_id) == 1
    assert not served.done
    assert all(handle.load.in_flight == 0 for handle in data_plane().registry.snapshot.workers)


async def test_an_unreachable_engine_is_retried_on_the_next_worker(start_engine_gateway: Start, make_gateway) -> None:
    gw = await start_engine_gateway()
    dead = dataclasses.replace(gw.record, id="dead-worker", url=f"grpc://127.0.0.1:{free_port()}", order=(0.0, "a"))
    live = dataclasses.replace(gw.record, order=(1.0, "b"))
    http = make_gateway([dead, live], policy="round_robin")
    for _ in range(4):
        response = await http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": user("hi")})
        assert response.status_code == 200, response.text
    alone = make_gateway([dead])
    response = await alone.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": user("hi")})
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_unavailable"


async def test_models_lists_the_engine_model(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    page = await gw.sdk().models.list()
    assert [model.id for model in page.data] == [QWEN_MODEL]


async def test_profile_d_puts_usage_on_the_last_finish_chunk(start_engine_gateway: Start) -> None:
    model = "deepseek-ai/deepseek-v4-flash"
    gw = await start_engine_gateway(model=model)
    body = {"model": model, "messages": user("hi"), "stream": True, "stream_options": {"include_usage": True}}
    chunks = [json.loads(e) for e in sse((await gw.http.post("/v1/chat/completions", json=body)).content)[:-1]]
    assert all(chunk["choices"] for chunk in chunks)  # no usage-only chunk
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == len(gw.engine.state.requests[-1].outputs[0])
    assert all(chunk["usage"] is None for chunk in chunks[:-1])


async def test_profile_a_streams_usage_by_default(start_engine_gateway: Start) -> None:
    model = "moonshotai/Kimi-K2-Instruct"
    gw = await start_engine_gateway(model=model)
    body = {"model": model, "messages": user("hi"), "stream": True}
    chunks = [json.loads(e) for e in sse((await gw.http.post("/v1/chat/completions", json=body)).content)[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0
