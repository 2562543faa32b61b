"""The mock OpenAI-compatible worker, served for real on loopback and driven by the openai SDK
(strict response validation) and by raw aiohttp requests. No database; asyncio_mode = auto."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from standins import mock_responses
from standins.mock_worker import MockWorkerConfig, build_app, mock_state

REPO = Path(__file__).resolve().parents[2]
CHAT: dict[str, Any] = {"model": "mock-model", "messages": [{"role": "user", "content": "hello there world"}]}
TEXT_16 = " ".join(f"tok{i}" for i in range(16))

Start = Callable[..., Awaitable[str]]


@pytest_asyncio.fixture
async def start() -> AsyncIterator[Start]:
    """Serves ``build_app(MockWorkerConfig(**options))`` on 127.0.0.1, port 0; returns the base URL."""
    runners: list[web.AppRunner] = []

    async def serve(handler_cancellation: bool = True, **options: Any) -> str:
        options.setdefault("model", "mock-model")
        runner = web.AppRunner(
            build_app(MockWorkerConfig(**options)), access_log=None, handler_cancellation=handler_cancellation
        )
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield serve
    for runner in runners:
        await runner.cleanup()


@pytest_asyncio.fixture
async def url(start: Start) -> str:
    return await start()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def sdk_client(url: str, api_key: str = "x", strict: bool = True) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key=api_key, _strict_response_validation=strict, max_retries=0
    )


@pytest_asyncio.fixture
async def sdk(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    client = sdk_client(url)
    yield client
    await client.close()


async def post(http: aiohttp.ClientSession, url: str, body: Any, **kwargs: Any) -> tuple[int, Any]:
    async with http.post(url, json=body, **kwargs) as response:
        return response.status, await response.json(content_type=None)


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with http.get(f"{url}/_mock/stats") as response:
        return await response.json()


async def wait_for_stats(http: aiohttp.ClientSession, url: str, **expected: int) -> dict[str, int]:
    deadline = time.monotonic() + 5
    while True:
        current = await stats(http, url)
        if all(current[k] == v for k, v in expected.items()) or time.monotonic() > deadline:
            return current
        await asyncio.sleep(0.02)


def native(max_new_tokens: int, **body: Any) -> dict[str, Any]:
    return {**body, "sampling_params": {"max_new_tokens": max_new_tokens}}


def sse_data(raw: bytes) -> list[str]:
    return [event[6:] for event in raw.decode().split("\n\n") if event.startswith("data: ")]


# --- OpenAI-compatible routes through the SDK ---------------------------------------------------


async def test_models_list(sdk: openai.AsyncOpenAI) -> None:
    page = await sdk.models.list()
    assert [m.id for m in page.data] == ["mock-model"]
    model = page.data[0]
    assert model.object == "model" and model.owned_by == "sglang" and isinstance(model.created, int)
    assert model.model_extra is not None and model.model_extra["max_model_len"] == 4096


async def test_chat_completion(sdk: openai.AsyncOpenAI) -> None:
    result = await sdk.chat.completions.create(model="any-name", messages=CHAT["messages"])
    assert result.id.startswith("chatcmpl-") and result.object == "chat.completion"
    assert result.model == "any-name"  # the request's model
    (choice,) = result.choices
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == TEXT_16
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (3, 16, 19)


async def test_chat_caps_n_and_content_parts(sdk: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]
    capped = await sdk.chat.completions.create(model="m", messages=messages, max_completion_tokens=3, n=2)
    assert [c.index for c in capped.choices] == [0, 1]
    assert all(c.message.content == "tok0 tok1 tok2" and c.finish_reason == "length" for c in capped.choices)
    assert capped.usage is not None and capped.usage.completion_tokens == 6 and capped.usage.prompt_tokens == 2
    legacy = await sdk.chat.completions.create(model="m", messages=messages, max_tokens=16)
    assert legacy.choices[0].finish_reason == "length"
    roomy = await sdk.chat.completions.create(model="m", messages=messages, max_tokens=17)
    assert roomy.choices[0].finish_reason == "stop"


async def test_chat_stream_with_usage(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="mock-model", messages=CHAT["messages"], stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) == 16 + 2
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:17])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:16]) == TEXT_16
    assert all(c.choices[0].finish_reason is None for c in chunks[:16])
    assert chunks[16].choices[0].finish_reason == "stop"
    assert chunks[17].choices == [] and chunks[17].usage is not None
    assert chunks[17].usage.completion_tokens == 16 and chunks[17].usage.prompt_tokens == 3
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)


async def test_chat_stream_raw_framing(url: str, http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True, "n": 2, "max_tokens": 2}
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        raw = await response.read()
    assert raw.endswith(b"\n\ndata: [DONE]\n\n")
    events = sse_data(raw)
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert len(chunks) == 2 * 2 + 2  # per token per choice, then one finish chunk per choice
    assert [c["choices"][0]["index"] for c in chunks] == [0, 1, 0, 1, 0, 1]
    assert chunks[-1]["choices"][0] == {"index": 1, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert not any("usage" in c for c in chunks)  # no include_usage, no usage chunk


async def test_completions(sdk: openai.AsyncOpenAI) -> None:
    result = await sdk.completions.create(model="mock-model", prompt="one two", max_tokens=4)
    assert result.id.startswith("cmpl-") and result.object == "text_completion"
    (choice,) = result.choices
    assert choice.text == "tok0 tok1 tok2 tok3" and choice.finish_reason == "length" and choice.logprobs is None
    assert result.usage is not None and result.usage.prompt_tokens == 2 and result.usage.total_tokens == 6
    batch = await sdk.completions.create(model="mock-model", prompt=["a", "b c"], n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.usage is not None and batch.usage.prompt_tokens == 3 and batch.usage.completion_tokens == 64


async def test_completions_stream(url: str) -> None:
    # Like OpenAI itself, intermediate chunks carry finish_reason null, which the SDK's `Completion`
    # type does not allow under strict validation; hence the default (lenient) client here.
    client = sdk_client(url, strict=False)
    try:
        stream = await client.completions.create(
            model="mock-model", prompt="hi", stream=True, max_tokens=3, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    assert [c.choices[0].text for c in chunks[:3]] == ["tok0", " tok1", " tok2"]
    assert chunks[3].choices[0].finish_reason == "length" and chunks[3].choices[0].text == ""
    assert chunks[4].choices == [] and chunks[4].usage is not None and chunks[4].usage.completion_tokens == 3
    assert all(c.object == "text_completion" for c in chunks)


async def test_embeddings(url: str, sdk: openai.AsyncOpenAI) -> None:
    single = await sdk.embeddings.create(model="mock-model", input="hello world", encoding_format="float")
    (item,) = single.data
    assert item.object == "embedding" and item.index == 0 and len(item.embedding) == 8
    assert abs(sum(v * v for v in item.embedding) - 1.0) < 1e-4
    assert single.usage.prompt_tokens == 2 and single.usage.total_tokens == 2
    batch = await sdk.embeddings.create(model="mock-model", input=["hello world", "other"], encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1]
    assert batch.data[0].embedding == item.embedding  # deterministic
    assert batch.data[1].embedding != item.embedding
    wide = await sdk.embeddings.create(model="m", input=[1, 2, 3], dimensions=32, encoding_format="float")
    assert len(wide.data[0].embedding) == 32 and wide.usage.prompt_tokens == 3
    # The SDK asks for base64 by default (its strict validation would reject that), so: lenient client.
    lenient = sdk_client(url, strict=False)
    try:
        decoded = await lenient.embeddings.create(model="mock-model", input="hello world")
    finally:
        await lenient.close()
    assert decoded.data[0].embedding == pytest.approx(item.embedding, abs=1e-6)


# --- controls ----------------------------------------------------------------------------------


async def test_mock_status_gives_openai_error(url: str, sdk: openai.AsyncOpenAI, http: aiohttp.ClientSession) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        await sdk.chat.completions.create(model="m", messages=CHAT["messages"], extra_body={"mock": {"status": 429}})
    assert caught.value.status_code == 429
    with pytest.raises(openai.InternalServerError):
        await sdk.chat.completions.create(
            model="m", messages=CHAT["messages"], stream=True, extra_body={"mock": {"status": 503}}
        )
    for path, body in [
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/completions", {"prompt": "x", "stream": True}),
        ("/v1/embeddings", {"input": "x"}),
        ("/generate", {"text": "x", "stream": True}),
        ("/v1/tokenize", {"prompt": "x"}),
    ]:
        async with http.post(f"{url}{path}", json={**body, "mock": {"status": 422}}) as response:
            assert response.status == 422
            assert response.headers["Content-Type"] == "application/json"
            error = (await response.json())["error"]
        assert set(error) >= {"message", "type", "code"} and error["code"] == 422


async def test_mock_tokens_and_delay(url: str, http: aiohttp.ClientSession) -> None:
    begun = time.monotonic()
    status, body = await post(http, f"{url}/v1/chat/completions", {**CHAT, "mock": {"tokens": 3, "delay_ms": 40}})
    assert status == 200 and body["choices"][0]["message"]["content"] == "tok0 tok1 tok2"
    assert time.monotonic() - begun >= 0.11
    stream_body = {**CHAT, "stream": True, "mock": {"tokens": 2, "delay_ms": 60}}
    begun = time.monotonic()
    async with http.post(f"{url}/v1/chat/completions", json=stream_body) as response:
        raw = await response.read()
    assert time.monotonic() - begun >= 0.11
    assert len(sse_data(raw)) == 2 + 1 + 1
    status, body = await post(http, f"{url}/v1/chat/completions", {**CHAT, "mock": {"tokens": 0}})
    assert body["choices"][0]["message"]["content"] == "" and body["usage"]["completion_tokens"] == 0


async def test_config_tokens_and_delay(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(tokens=2, delay_ms=50)
    begun = time.monotonic()
    async with http.post(f"{url}/v1/completions", json={"prompt": "x", "stream": True}) as response:
        raw = await response.read()
    assert time.monotonic() - begun >= 0.09
    assert [orjson.loads(e)["choices"][0]["text"] for e in sse_data(raw)[:2]] == ["tok0", " tok1"]


async def test_fail_after_cuts_stream_without_done(url: str, http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True, "mock": {"fail_after": 2, "tokens": 10}}
    received = b""
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for data in response.content.iter_any():
                received += data
    events = sse_data(received)
    assert len(events) == 2 and "[DONE]" not in received.decode()
    current = await wait_for_stats(http, url, streams_aborted=1, in_flight=0)
    assert current["streams_started"] == 1 and current["streams_aborted"] == 1
    assert current["streams_completed"] == 0 and current["streams_disconnected"] == 0


async def test_fail_after_in_sdk_stream_and_non_stream(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="m", messages=CHAT["messages"], stream=True, extra_body={"mock": {"fail_after": 1}}
    )
    seen = []
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            seen.append(chunk)
    assert len(seen) == 1
    with pytest.raises(openai.APIConnectionError):
        await sdk.chat.completions.create(**CHAT, extra_body={"mock": {"fail_after": 0}})


@pytest.mark.parametrize("handler_cancellation", [True, False])
async def test_client_disconnect_is_counted(
    start: Start, http: aiohttp.ClientSession, handler_cancellation: bool
) -> None:
    url = await start(handler_cancellation=handler_cancellation)
    body = {**CHAT, "stream": True, "mock": {"tokens": 200, "delay_ms": 20}}
    response = await http.post(f"{url}/v1/chat/completions", json=body)
    assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
    assert (await stats(http, url))["in_flight"] == 1
    response.close()  # drop the connection mid-stream
    current = await wait_for_stats(http, url, streams_disconnected=1, in_flight=0)
    expected = {"requests": 1, "streams_started": 1, "streams_completed": 0, "streams_aborted": 0}
    assert current == {
        **expected, "requests_by_path": {"/v1/chat/completions": 1}, "streams_disconnected": 1, "in_flight": 0,
        "peak_in_flight": 1,
    }


async def test_completed_streams_are_counted(url: str, http: aiohttp.ClientSession) -> None:
    routes = [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "x"}), ("/generate", {"text": "x"})]
    for path, body in routes:
        async with http.post(f"{url}{path}", json={**body, "stream": True}) as response:
            assert (await response.read()).endswith(b"data: [DONE]\n\n")
    current = await wait_for_stats(http, url, streams_completed=3, in_flight=0)
    assert current["streams_started"] == 3 and current["streams_disconnected"] == 0


# --- introspection, auth, errors ----------------------------------------------------------------


async def test_request_log(url: str, http: aiohttp.ClientSession) -> None:
    status, _ = await post(http, f"{url}/v1/chat/completions?x=1", CHAT, headers={"X-Request-ID": "trace-1"})
    assert status == 200
    async with http.get(f"{url}/health") as response:
        assert response.status == 200
    async with http.get(f"{url}/_mock/requests") as response:
        log = await response.json()
    assert [(r["method"], r["path"]) for r in log] == [("POST", "/v1/chat/completions"), ("GET", "/health")]
    first = log[0]
    assert first["json"] == CHAT and orjson.loads(first["raw"]) == CHAT and first["query"] == "x=1"
    assert first["headers"]["x-request-id"] == "trace-1" and first["headers"]["content-type"] == "application/json"
    async with http.get(f"{url}/_mock/requests", params={"path": "/health"}) as response:
        assert [r["path"] for r in await response.json()] == ["/health"]
    for i in range(105):
        await post(http, f"{url}/v1/tokenize", {"prompt": f"n{i}"})
    async with http.get(f"{url}/_mock/requests") as response:
        log = await response.json()
    assert len(log) == 100 and log[-1]["json"]["prompt"] == "n104" and log[0]["json"]["prompt"] == "n5"
    async with http.delete(f"{url}/_mock/requests") as response:
        assert response.status == 200
    async with http.get(f"{url}/_mock/requests") as response:
        assert await response.json() == []
    assert (await stats(http, url))["requests"] == 107
    async with http.delete(f"{url}/_mock/stats") as response:
        assert (await response.json())["requests"] == 0


async def test_api_key(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(api_key="sk-worker")
    async with http.get(f"{url}/health") as response:
        assert response.status == 200
    for path in ("/v1/models", "/health_generate", "/_mock/stats"):
        async with http.get(f"{url}{path}") as response:
            assert response.status == 401
            assert response.headers["Content-Type"] == "application/json"
            assert (await response.json())["error"]["type"] == "authentication_error"
    wrong, right = sdk_client(url, api_key="nope"), sdk_client(url, api_key="sk-worker")
    try:
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="m", messages=CHAT["messages"])
        result = await right.chat.completions.create(model="m", messages=CHAT["messages"])
        assert result.choices[0].message.content == TEXT_16
    finally:
        await wrong.close()
        await right.close()
    async with http.get(f"{url}/_mock/stats", headers={"Authorization": "Bearer sk-worker"}) as response:
        assert response.status == 200 and (await response.json())["requests"] == 5


async def test_bad_requests(url: str, http: aiohttp.ClientSession) -> None:
    headers = {"Content-Type": "application/json"}
    async with http.post(f"{url}/v1/chat/completions", data=b"{not json", headers=headers) as response:
        assert response.status == 400 and response.headers["Content-Type"] == "application/json"
        assert (await response.json())["error"]["type"] == "invalid_request_error"
    for body in ([1, 2], {"messages": "hi"}, {**CHAT, "mock": {"tokens": -1}}, {**CHAT, "mock": "x"}, {**CHAT, "n": 0}):
        status, error = await post(http, f"{url}/v1/chat/completions", body)
        assert status == 400 and set(error["error"]) >= {"message", "type", "code"}, body
    long_prompt = {"messages": [{"role": "user", "content": "w " * 4096}]}
    status, error = await post(http, f"{url}/v1/chat/completions", long_prompt)
    assert status == 400 and "maximum context length is 4096" in error["error"]["message"]
    status, error = await post(http, f"{url}/v1/completions", {"prompt": "x", "max_tokens": 5000})
    assert status == 400
    async with http.get(f"{url}/v1/nothing-here") as response:
        assert response.status == 404 and (await response.json())["error"]["code"] == 404
    async with http.get(f"{url}/v1/chat/completions") as response:
        assert response.status == 405 and "error" in await response.json()


async def test_context_window_caps_generation(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(max_model_len=8)
    status, body = await post(http, f"{url}/v1/completions", {"prompt": "a b c"})
    assert status == 200 and body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"


# --- runtime detection and native routes --------------------------------------------------------


@pytest.mark.parametrize(
    ("owned_by", "server_info", "version"), [("sglang", 200, 404), ("vllm", 404, 200), ("acme", 404, 404)]
)
async def test_runtime_detection_routes(
    start: Start, http: aiohttp.ClientSession, owned_by: str, server_info: int, version: int
) -> None:
    url = await start(owned_by=owned_by, model="org/llama")
    async with http.get(f"{url}/v1/models") as response:
        assert (await response.json())["data"][0]["owned_by"] == owned_by
    async with http.get(f"{url}/get_model_info") as response:
        info = await response.json()
    assert info == {"model_path": "org/llama", "tokenizer_path": "org/llama", "is_generation": True}
    for path in ("/get_server_info", "/server_info"):
        async with http.get(f"{url}{path}") as response:
            assert response.status == server_info
            if server_info == 200:
                payload = await response.json()
                assert payload["model_path"] == "org/llama" and payload["version"] == "0.0.0-mock"
    async with http.get(f"{url}/version") as response:
        assert response.status == version
        if version == 200:
            assert await response.json() == {"version": "0.0.0-mock"}
    for path in ("/health", "/health_generate"):
        async with http.get(f"{url}{path}") as response:
            assert response.status == 200


async def test_generate(url: str, http: aiohttp.ClientSession) -> None:
    status, body = await post(http, f"{url}/generate", native(text="hello world", max_new_tokens=4))
    assert status == 200 and body["text"] == "tok0 tok1 tok2 tok3"
    meta = body["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (2, 4)
    assert meta["finish_reason"]["type"] == "length" and isinstance(meta["id"], str)
    status, batch = await post(http, f"{url}/generate", {"text": ["a", "b c"], "mock": {"tokens": 1}})
    assert [r["text"] for r in batch] == ["tok0", "tok0"] and batch[1]["meta_info"]["prompt_tokens"] == 2
    status, ids = await post(http, f"{url}/generate", native(input_ids=[5, 6, 7], max_new_tokens=1))
    assert ids["meta_info"]["prompt_tokens"] == 3
    async with http.post(f"{url}/generate", json={"text": "hi", "stream": True, "mock": {"tokens": 3}}) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        events = sse_data(await response.read())
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert [c["text"] for c in chunks] == ["tok0", "tok0 tok1", "tok0 tok1 tok2"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:2]] == [None, None]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


async def test_rerank_and_classify(url: str, http: aiohttp.ClientSession) -> None:
    body = {"model": "r", "query": "red apple", "documents": ["a green pear", "red apple pie", {"text": "apple"}]}
    for path in ("/v1/rerank", "/rerank"):
        status, result = await post(http, f"{url}{path}", body)
        assert status == 200 and result["model"] == "r"
        assert [r["index"] for r in result["results"]] == [1, 2, 0]
        assert result["results"][0]["document"] == {"text": "red apple pie"}
        assert all(0 <= r["relevance_score"] <= 1 for r in result["results"])
    status, top = await post(http, f"{url}/v1/rerank", {**body, "top_n": 1, "return_documents": False})
    assert top["results"] == [{"index": 1, "relevance_score": result["results"][0]["relevance_score"]}]
    status, classified = await post(http, f"{url}/v1/classify", {"model": "c", "input": ["good", "bad"]})
    assert status == 200 and classified["object"] == "list" and classified["model"] == "c"
    assert classified["id"].startswith("classify-") and classified["usage"]["prompt_tokens"] == 2
    for index, item in enumerate(classified["data"]):
        assert item["index"] == index and item["num_classes"] == 2 and sum(item["probs"]) == pytest.approx(1)
        assert item["label"] == ("positive" if item["probs"][1] > item["probs"][0] else "negative")


async def test_tokenize_round_trip(url: str, http: aiohttp.ClientSession) -> None:
    status, tokens = await post(http, f"{url}/v1/tokenize", {"model": "m", "prompt": "the quick  fox the"})
    assert status == 200 and tokens["count"] == 4 and tokens["max_model_len"] == 4096
    assert tokens["tokens"][0] == tokens["tokens"][3]
    assert tokens["tokens"] == mock_responses.tokenize("the quick fox the")
    status, text = await post(http, f"{url}/v1/detokenize", {"model": "m", "tokens": tokens["tokens"]})
    assert status == 200 and text == {"prompt": "the quick fox the"}
    status, generated = await post(http, f"{url}/tokenize", {"prompt": "tok0 tok1"})
    status, back = await post(http, f"{url}/detokenize", {"tokens": generated["tokens"] + [7]})
    assert back["prompt"] == "tok0 tok1 <7>"
    status, chat = await post(http, f"{url}/v1/tokenize", {"messages": CHAT["messages"]})
    assert chat["count"] == 3


# --- config, in-process state, CLI --------------------------------------------------------------


def test_config_validation_and_runtime() -> None:
    assert MockWorkerConfig(model="m").runtime == "sglang"
    assert MockWorkerConfig(model="m", owned_by="vllm").runtime == "vllm"
    assert MockWorkerConfig(model="m", owned_by="openai").runtime == "generic"
    for bad in ({"model": ""}, {"model": "m", "tokens": -1}, {"model": "m", "max_model_len": 0}):
        with pytest.raises(ValueError):
            MockWorkerConfig(**bad)


async def test_in_process_state(http: aiohttp.ClientSession) -> None:
    app = build_app(MockWorkerConfig(model="m"))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        await post(http, f"{url}/v1/embeddings", {"input": "x"})
        state = mock_state(app)
        assert [r["path"] for r in state.requests] == ["/v1/embeddings"]
        assert state.stats()["requests"] == 1
    finally:
        await runner.cleanup()


def test_management_command_parses_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from standins.management.commands import runmockworker

    calls: list[tuple[MockWorkerConfig, str, int]] = []
    monkeypatch.setattr(runmockworker, "run_mock_worker", lambda config, host, port: calls.append((config, host, port)))
    command = runmockworker.Command()
    parser = command.create_parser("manage.py", "runmockworker")
    argv = ["--port", "8100", "--model", "m", "--owned-by", "vllm", "--tokens", "4", "--delay-ms", "2.5"]
    options = vars(parser.parse_args([*argv, "--api-key", "k", "--max-model-len", "64"]))
    command.handle(**options)
    defaults = vars(parser.parse_args(["--port", "0", "--model", "d"]))
    command.handle(**defaults)
    assert calls == [
        (MockWorkerConfig("m", "vllm", 4, 2.5, "k", 64), "127.0.0.1", 8100),
        (MockWorkerConfig("d"), "127.0.0.1", 0),
    ]


async def test_run_mock_worker_serves_and_announces(http: aiohttp.ClientSession) -> None:
    code = (
        "from standins.mock_worker import MockWorkerConfig, run_mock_worker; "
        "run_mock_worker(MockWorkerConfig(model='cli-model', owned_by='vllm'), '127.0.0.1', 0)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, cwd=REPO, env=env, stdout=PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        prefix = "mock worker serving cli-model on http://127.0.0.1:"
        assert line.startswith(prefix), line
        url = f"http://127.0.0.1:{int(line[len(prefix):])}"
        async with http.get(f"{url}/health") as health:
            assert health.status == 200
        async with http.get(f"{url}/version") as version:
            assert await version.json() == {"version": "0.0.0-mock"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
