"""/v1/completions, /generate, /v1/tokenize and /v1/detokenize on a gRPC worker, served by the
gateway with the model's own tokenizer."""

from __future__ import annotations

import asyncio
import base64
import json
import struct

import pytest
from tokenizers import Tokenizer

from standins.scripted_engine import DEFAULT_TEXT
from tests.inference.served.conftest import QWEN, QWEN_MODEL, Start
from tests.inference.served.test_chat import sse

QWEN_TOKENIZER = Tokenizer.from_file(f"{QWEN}/tokenizer.json")


async def test_completion_through_the_sdk(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.sdk().completions.create(model=QWEN_MODEL, prompt="Once upon a time", max_tokens=50)
    assert answer.object == "text_completion"
    assert answer.choices[0].text == DEFAULT_TEXT
    assert answer.choices[0].finish_reason == "stop"
    served = gw.engine.state.requests[-1]
    assert served.prompt_text == "Once upon a time"  # no chat template
    assert answer.usage is not None and answer.usage.prompt_tokens == len(served.input_ids)


async def test_prompt_array_is_one_engine_request_each(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.sdk().completions.create(model=QWEN_MODEL, prompt=["first", "second prompt"], n=2, max_tokens=50)
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    prompts = sorted(r.prompt_text for r in gw.engine.state.requests)
    assert prompts == ["first", "second prompt"]
    assert all(r.n == 2 for r in gw.engine.state.requests)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == sum(len(r.input_ids) for r in gw.engine.state.requests)


async def test_token_id_prompt_echo_and_suffix(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    ids = QWEN_TOKENIZER.encode("Tell me", add_special_tokens=False).ids
    body = {"model": QWEN_MODEL, "prompt": ids, "echo": True, "suffix": " [end]", "max_tokens": 50}
    choice = (await gw.http.post("/v1/completions", json=body)).json()["choices"][0]
    assert choice["text"] == "Tell me" + DEFAULT_TEXT + " [end]"
    assert tuple(gw.engine.state.requests[-1].input_ids) == tuple(ids)


async def test_completion_stream_with_usage(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    # Not strict: the SDK types a completion chunk's finish_reason as never null, which OpenAI's own
    # streams (and every engine's) send until the last chunk.
    stream = await gw.sdk(strict=False).completions.create(
        model=QWEN_MODEL, prompt="hi", stream=True, stream_options={"include_usage": True}, max_tokens=50
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == DEFAULT_TEXT
    assert chunks[-1].usage is not None and chunks[-1].choices == []


async def test_completion_logprobs(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.sdk().completions.create(model=QWEN_MODEL, prompt="hi", logprobs=2, max_tokens=3)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and len(logprobs.tokens) == 3
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert logprobs.text_offset == [0, len(logprobs.tokens[0]), len(logprobs.tokens[0]) + len(logprobs.tokens[1])]
    assert logprobs.top_logprobs is not None and all(len(top) == 2 for top in logprobs.top_logprobs)


async def test_generate_native(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    answer = (await gw.http.post("/generate", json=body)).json()
    served = gw.engine.state.requests[-1]
    assert served.sampling["sampling_params"]["max_new_tokens"] == 4
    assert answer["meta_info"]["finish_reason"]["type"] == "length"
    assert answer["meta_info"]["completion_tokens"] == 4 and answer["output_ids"] == served.outputs[0]
    assert answer["text"] == QWEN_TOKENIZER.decode(served.outputs[0])


async def test_generate_stream_is_cumulative(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=2)
    body = {"input_ids": [9707, 1879], "sampling_params": {"max_new_tokens": 64}, "stream": True}
    events = sse((await gw.http.post("/generate", json=body)).content)
    assert events[-1] == "[DONE]"
    objects = [json.loads(e) for e in events[:-1]]
    texts = [o["text"] for o in objects]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))
    assert texts[-1] == DEFAULT_TEXT
    assert objects[-1]["meta_info"]["finish_reason"]["type"] == "stop"


async def test_generate_bad_body_is_400(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    for body in ({"sampling_params": {}}, {"text": "x", "input_ids": [1]}, {"text": "x", "sampling_params": {"temperature": "hot"}}):
        response = await gw.http.post("/generate", json=body)
        assert response.status_code == 400, body


async def test_tokenize_and_detokenize(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(context_length=4096)
    tokens = (await gw.http.post("/v1/tokenize", json={"model": QWEN_MODEL, "prompt": "Hello world"})).json()
    expected = QWEN_TOKENIZER.encode("Hello world").ids
    assert tokens == {"tokens": expected, "count": len(expected), "max_model_len": 4096}
    text = (await gw.http.post("/v1/detokenize", json={"model": QWEN_MODEL, "tokens": expected})).json()
    assert text == {"text": "Hello world"}
    batch = (await gw.http.post("/v1/tokenize", json={"model": QWEN_MODEL, "prompt": ["a", "b c"]})).json()
    assert batch["count"] == [len(t) for t in batch["tokens"]]
    assert gw.engine.state.requests == []  # the engine is not asked


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/tokenize", {"model": QWEN_MODEL, "prompt": 5}),
        ("/v1/detokenize", {"model": QWEN_MODEL, "tokens": ["a"]}),
        ("/v1/detokenize", {"model": QWEN_MODEL, "tokens": [10**9]}),
        ("/v1/completions", {"model": QWEN_MODEL, "prompt": [{"x": 1}]}),
    ],
)
async def test_bad_bodies_are_400(start_engine_gateway: Start, path: str, body: dict) -> None:
    gw = await start_engine_gateway()
    response = await gw.http.post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/rerank", "/v1/classify"])
async def test_routes_the_pipeline_does_not_serve_are_501(start_engine_gateway: Start, path: str) -> None:
    gw = await start_engine_gateway()
    response = await gw.http.post(path, json={"model": QWEN_MODEL, "query": "q", "documents": ["a"], "input": "x"})
    assert response.status_code == 501


@pytest.mark.parametrize("runtime", ["sglang", "vllm", "trtllm"])
async def test_embeddings_through_embed(start_engine_gateway: Start, runtime: str) -> None:
    gw = await start_engine_gateway(runtime)
    answer = await gw.sdk().embeddings.create(model=QWEN_MODEL, input=["hello world", "bonjour"], encoding_format="float")
    assert [item.index for item in answer.data] == [0, 1]
    assert all(len(item.embedding) == 8 for item in answer.data)
    assert answer.data[0].embedding != answer.data[1].embedding
    expected = len(QWEN_TOKENIZER.encode("hello world").ids) + len(QWEN_TOKENIZER.encode("bonjour").ids)
    assert answer.usage.prompt_tokens == expected
    # Not strict: the SDK validates before it decodes base64 (so it refuses OpenAI's own base64 too).
    encoded = await gw.sdk(strict=False).embeddings.create(
        model=QWEN_MODEL, input="hello world", encoding_format="base64", dimensions=4
    )
    raw = base64.b64decode(str(encoded.data[0].embedding))
    assert list(struct.unpack("<4f", raw)) == pytest.approx(answer.data[0].embedding[:4], rel=1e-6)


async def test_embeddings_on_a_runtime_without_embed_is_501(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway("tokenspeed")
    response = await gw.http.post("/v1/embeddings", json={"model": QWEN_MODEL, "input": "hi"})
    assert response.status_code == 501
    assert response.json()["error"]["code"] == "endpoint_not_supported"


async def test_a_prompt_array_lets_every_engine_request_end_itself(start_engine_gateway: Start) -> None:
    """Each prompt's generation ends on end-of-sequence one message before the engine's own end: the
    merged answer reads them all on to that end rather than aborting them (D42)."""
    gw = await start_engine_gateway(chunk_tokens=1)
    for stream in (False, True):
        body = {"model": QWEN_MODEL, "prompt": ["first", "second prompt"], "max_tokens": 50, "stream": stream}
        assert (await gw.http.post("/v1/completions", json=body)).status_code == 200
    await asyncio.sleep(0.2)
    assert len(gw.engine.state.requests) == 4 and gw.engine.state.aborted_ids() == []
