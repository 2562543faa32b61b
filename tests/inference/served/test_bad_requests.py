"""A client's bad request is the client's error, never the worker's (issue 22, item 1), on a gRPC
worker (the engine stand-in, a real grpc.aio server that refuses what the engines refuse with
INVALID_ARGUMENT) behind the in-process gateway.

- A prompt the engines would refuse (no token at all) is answered 400 before dispatch, with the
  spec's envelope (invalid_request_error, code 400, param the field), on every route that generates
  or embeds, streamed or whole.
- What only the engine can tell (here a prompt past the engine's own context length, the gateway not
  knowing it) comes back as the engine said it: 400, not retried, not counted against the worker, on
  both stream readers.
- A thousand bad requests from one tenant leave the model serving the others: the breaker stays
  closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from common import telemetry
from inference.routing.breaker import BreakerState
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerHandle
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer
from tests.inference.mcp.servers import serving
from tests.inference.served.conftest import QWEN, QWEN_MODEL, EngineGateway, Start, engine_record
from tests.responses_api.test_responses_on_grpc import LOOPBACK, PARSERS, mcp_tool, sse_events, weather_server

# A chat template that renders no text at all: every chat-shaped prompt then has no token.
SILENT_TEMPLATE = "{% for message in messages %}{% endfor %}"
ENGINE_CONTEXT = 16  # the stand-in's own context length, which the gateway is not told
LONG_PROMPT = "one two three four five six seven eight nine ten " * 4  # past ENGINE_CONTEXT tokens
PRE_DISPATCH = "must not be empty: it encodes to no tokens"
REFUSED = "The worker refused the request as invalid"


def outcomes(url: str, outcome: str) -> float:
    return telemetry.REGISTRY.get_sample_value("gw_worker_cb_outcomes_total", {"worker": url, "outcome": outcome}) or 0.0


def handle(gw: EngineGateway) -> WorkerHandle:
    return next(h for h in REGISTRY.snapshot.workers if h.url == gw.record.url)


def assert_validation_error(response: httpx.Response, param: str | None, message: str) -> None:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"  # an ordinary error, even with stream
    assert response.headers["x-gw-error-code"] == "400"
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", 400, param)
    assert message in error["message"]


def assert_worker_untouched(gw: EngineGateway) -> None:
    breaker = handle(gw).load.breaker
    assert breaker.state is BreakerState.CLOSED and breaker.failures == 0
    assert handle(gw).load.in_flight == 0


EMPTY_PROMPTS = [
    ("/v1/completions", {"model": QWEN_MODEL, "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": QWEN_MODEL, "prompt": ["a prompt", ""]}, "prompt"),
    ("/generate", {"text": ""}, "text"),
    ("/generate", {"text": ["a prompt", ""]}, "text"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body", "param"), EMPTY_PROMPTS)
async def test_a_prompt_of_no_tokens_is_refused_before_dispatch(
    start_engine_gateway: Start, path: str, body: dict[str, Any], param: str, stream: bool
) -> None:
    gw = await start_engine_gateway()
    response = await gw.http.post(path, json={**body, "stream": stream})
    assert_validation_error(response, param, PRE_DISPATCH)
    assert gw.engine.state.requests == []
    assert_worker_untouched(gw)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hello"}]}, "messages"),
        ("/v1/responses", {"model": QWEN_MODEL, "input": "Hello"}, "input"),
    ],
)
async def test_a_rendered_prompt_of_no_tokens_is_refused_before_dispatch(
    start_engine_gateway: Start, path: str, body: dict[str, Any], param: str, stream: bool
) -> None:
    gw = await start_engine_gateway(chat_template=SILENT_TEMPLATE)
    response = await gw.http.post(path, json={**body, "stream": stream})
    assert_validation_error(response, param, PRE_DISPATCH)
    assert gw.engine.state.requests == []
    assert_worker_untouched(gw)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": QWEN_MODEL, "prompt": []}, "prompt"),
        ("/v1/completions", {"model": QWEN_MODEL, "prompt": [[]]}, "prompt"),
        ("/v1/completions", {"model": QWEN_MODEL, "prompt": [[1, 2], []]}, "prompt"),
        ("/generate", {"input_ids": []}, "input_ids"),
        ("/generate", {"input_ids": [[1, 2], []]}, "input_ids"),
        ("/generate", {"text": []}, "text"),
        ("/v1/embeddings", {"model": QWEN_MODEL, "input": ""}, "input"),
        ("/v1/embeddings", {"model": QWEN_MODEL, "input": []}, "input"),
        ("/v1/embeddings", {"model": QWEN_MODEL, "input": [[]]}, "input"),
        ("/v1/embeddings", {"model": QWEN_MODEL, "input": ["text", ""]}, "input"),
        ("/v1/tokenize", {"model": QWEN_MODEL, "prompt": []}, "prompt"),
        ("/v1/chat/completions", {"model": QWEN_MODEL, "messages": []}, "messages"),
        ("/v1/responses", {"model": QWEN_MODEL, "input": ""}, "input"),
        ("/v1/responses", {"model": QWEN_MODEL, "input": []}, "input"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_empty_prompts_arrays_and_token_lists_are_400_on_every_served_route(
    start_engine_gateway: Start, path: str, body: dict[str, Any], param: str, stream: bool
) -> None:
    gw = await start_engine_gateway()
    response = await gw.http.post(path, json={**body, "stream": stream} if stream else body)
    assert_validation_error(response, param, "")
    assert gw.engine.state.requests == [] and gw.engine.state.embeds == []
    assert_worker_untouched(gw)


async def test_tokenize_and_detokenize_of_nothing_answer_nothing(start_engine_gateway: Start) -> None:
    """The two routes the gateway answers with its own tokenizer send nothing to the engine: an empty
    text has no tokens and no tokens are the empty text, as the engines' own routes answer."""
    gw = await start_engine_gateway()
    tokenized = await gw.http.post("/v1/tokenize", json={"model": QWEN_MODEL, "prompt": ""})
    assert tokenized.status_code == 200 and tokenized.json()["tokens"] == []
    detokenized = await gw.http.post("/v1/detokenize", json={"model": QWEN_MODEL, "tokens": []})
    assert detokenized.status_code == 200 and detokenized.json() == {"text": ""}


@pytest.mark.parametrize("reader", ["native", "grpcio"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": QWEN_MODEL, "prompt": LONG_PROMPT}),
        ("/v1/chat/completions", {"model": QWEN_MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}]}),
        ("/generate", {"text": LONG_PROMPT}),
    ],
)
async def test_what_the_engine_refuses_as_invalid_is_400_not_retried_not_counted(
    start_engine_gateway: Start, reader: str, stream: bool, path: str, body: dict[str, Any]
) -> None:
    gw = await start_engine_gateway(max_context_length=ENGINE_CONTEXT, gateway={"grpc_stream_reader": reader})
    spare = GrpcEngineServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL, max_context_length=ENGINE_CONTEXT))
    await spare.start()
    try:
        REGISTRY.publish([gw.record, engine_record(spare, QWEN_MODEL, QWEN)], {})  # two workers of the model
        urls = [gw.record.url, spare.url]
        before = {(url, kind): outcomes(url, kind) for url in urls for kind in ("success", "failure")}
        response = await gw.http.post(path, json={**body, "stream": stream})
        assert_validation_error(response, None, REFUSED)
        assert "INVALID_ARGUMENT" in response.json()["error"]["message"]
        assert gw.engine.state.requests == [] and spare.state.requests == []
        # One attempt (not retried on the other worker), counted as the answer it is, never a failure.
        assert sum(outcomes(url, "success") - before[url, "success"] for url in urls) == 1
        assert all(outcomes(url, "failure") == before[url, "failure"] for url in urls)
        workers = REGISTRY.snapshot.workers
        assert all(w.load.breaker.failures == 0 and w.load.breaker.state is BreakerState.CLOSED for w in workers)
    finally:
        await spare.stop()


async def test_a_thousand_bad_requests_from_one_tenant_leave_the_model_serving_the_others(
    start_engine_gateway: Start,
) -> None:
    tenants = (("mallory", "key-mallory"), ("alice", "key-alice"))
    gw = await start_engine_gateway(
        max_context_length=ENGINE_CONTEXT, gateway={"tenant_api_keys": tenants, "cb_failure_threshold": 3}
    )
    mallory = {"authorization": "Bearer key-mallory"}
    bad = [
        # refused by the gateway before dispatch (no token) ...
        {"model": QWEN_MODEL, "prompt": ""},
        {"model": QWEN_MODEL, "prompt": ["", "x"], "stream": True},
        # ... and by the engine itself (past its own context length: INVALID_ARGUMENT)
        {"model": QWEN_MODEL, "prompt": LONG_PROMPT},
        {"model": QWEN_MODEL, "prompt": LONG_PROMPT, "stream": True},
    ]
    answers = await asyncio.gather(
        *(gw.http.post("/v1/completions", json=bad[k % len(bad)], headers=mallory) for k in range(1000))
    )
    assert [a.status_code for a in answers] == [400] * 1000
    assert sum(REFUSED in a.json()["error"]["message"] for a in answers) == 500  # the engine's own refusals
    assert_worker_untouched(gw)
    good = await gw.http.post(
        "/v1/completions", json={"model": QWEN_MODEL, "prompt": "Hello", "max_tokens": 5},
        headers={"authorization": "Bearer key-alice"},
    )  # fmt: skip
    assert good.status_code == 200, good.text
    assert good.json()["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("refused_by", ["gateway", "engine"])
async def test_a_later_responses_turn_refused_as_invalid_is_not_the_workers_failure(
    start_engine_gateway: Start, refused_by: str, stream: bool
) -> None:
    """A Responses turn after an MCP call whose prompt no longer fits (the tool's long answer) fails
    the response; refused by the gateway's context check or by the engine itself, it is the request's
    fault: the breaker (here opened by one failure) stays closed."""
    body: dict[str, Any] = {"model": QWEN_MODEL, "input": "[[mock:tool_call]] weather?", "reasoning": {"effort": "none"}}
    with serving(weather_server("rain " * 200 + "[[mock:text]]")) as url:
        body["tools"] = [mcp_tool(url)]
        probe = await start_engine_gateway(**PARSERS, gateway=LOOPBACK)  # how long each turn's prompt is
        assert (await probe.http.post("/v1/responses", json=body)).json()["status"] == "completed"
        first, second = (len(r.input_ids) for r in probe.engine.state.requests)
        limit = {"context_length" if refused_by == "gateway" else "max_context_length": (first + second) // 2}
        gw = await start_engine_gateway(**PARSERS, **limit, gateway={**LOOPBACK, "cb_failure_threshold": 1})
        response = await gw.http.post("/v1/responses", json={**body, "stream": stream})
    assert response.status_code == 200
    events = sse_events(response.content) if stream else [{"response": response.json()}]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and [item["type"] for item in failed["output"]][:2] == ["mcp_list_tools", "mcp_call"]
    assert ("context length" if refused_by == "gateway" else "INVALID_ARGUMENT") in failed["error"]["message"]
    assert_worker_untouched(gw)
