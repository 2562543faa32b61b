"""Relay of every data-plane route to an HTTP worker, with model resolution and pass-through."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from inference.api.relay import forwarded_headers
from tests.conftest import RunningWorker, record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


async def test_chat_completion_is_relayed(gateway, worker: RunningWorker) -> None:
    response = await gateway.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    received = worker.requests()[-1]
    assert received["path"] == "/v1/chat/completions"
    assert received["json"] == CHAT


async def test_completion_is_relayed(gateway, worker: RunningWorker) -> None:
    response = await gateway.post("/v1/completions", json={"model": "mock-model", "prompt": "hi", "max_tokens": 3})
    assert response.status_code == 200
    assert response.json()["object"] == "text_completion"
    assert worker.requests()[-1]["path"] == "/v1/completions"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "mock-model", "input": "hello"}),
        ("/v1/rerank", {"model": "mock-model", "query": "q", "documents": ["a", "b"]}),
        ("/rerank", {"model": "mock-model", "query": "q", "documents": ["a", "b"]}),
        ("/v1/classify", {"model": "mock-model", "input": "hello"}),
        ("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}}),
        ("/v1/tokenize", {"model": "mock-model", "prompt": "hello world"}),
        ("/v1/detokenize", {"model": "mock-model", "tokens": [1, 2, 3]}),
    ],
)
async def test_native_and_compatible_routes_are_relayed(gateway, worker: RunningWorker, path: str, body: dict) -> None:
    response = await gateway.post(path, json=body)
    assert response.status_code == 200, response.text
    received = worker.requests()[-1]
    assert received["path"] == path
    assert received["json"] == body
    assert response.headers["content-type"].startswith("application/json")


async def test_alias_is_resolved_and_replaced_in_forwarded_body(gateway, worker: RunningWorker) -> None:
    response = await gateway.post("/v1/chat/completions", json={**CHAT, "model": "fast"})
    assert response.status_code == 200
    assert worker.requests()[-1]["json"]["model"] == "mock-model"


async def test_unmodelled_fields_and_numbers_are_forwarded_unchanged(gateway, worker: RunningWorker) -> None:
    raw = b'{"model":"mock-model","messages":[{"role":"user","content":"x"}],"temperature":0.95,"top_p":1.0,"vendor_knob":{"a":[1,2.50]}}'
    response = await gateway.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200
    received = worker.requests()[-1]
    assert received["json"]["vendor_knob"] == {"a": [1, 2.5]}
    assert received["json"]["temperature"] == 0.95
    assert received["raw"] == raw.decode()  # forwarded byte for byte when nothing needed rewriting


async def test_rewritten_body_keeps_number_values(gateway, worker: RunningWorker) -> None:
    raw = b'{"model":"fast","messages":[{"role":"user","content":"x"}],"temperature":0.95,"top_p":0.9}'
    await gateway.post("/v1/chat/completions", content=raw)
    sent = worker.requests()[-1]["raw"].encode()
    assert b'"temperature":0.95' in sent and b'"top_p":0.9' in sent


async def test_max_tokens_migrates_before_forwarding(gateway, worker: RunningWorker) -> None:
    await gateway.post("/v1/chat/completions", json={**CHAT, "max_tokens": 7})
    body = worker.requests()[-1]["json"]
    assert body["max_completion_tokens"] == 7
    assert "max_tokens" not in body


async def test_request_id_is_forwarded_and_returned(gateway, worker: RunningWorker) -> None:
    response = await gateway.post("/v1/chat/completions", json=CHAT, headers={"X-Request-ID": "trace-abc-123"})
    assert response.headers["x-request-id"] == "trace-abc-123"
    assert worker.requests()[-1]["headers"]["x-request-id"] == "trace-abc-123"


async def test_request_id_is_generated_when_absent(gateway, worker: RunningWorker) -> None:
    response = await gateway.post("/v1/chat/completions", json=CHAT)
    generated = response.headers["x-request-id"]
    assert generated.startswith("req-")
    assert worker.requests()[-1]["headers"]["x-request-id"] == generated


async def test_tracing_headers_are_forwarded_but_client_credentials_are_not(make_gateway, worker: RunningWorker) -> None:
    client = make_gateway([record_for(worker)], api_key="sk-gateway-key")
    headers = {"Authorization": "Bearer sk-gateway-key", "traceparent": "00-abc-def-01", "x-secret-thing": "no"}
    await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    received = worker.requests()[-1]["headers"]
    assert received["traceparent"] == "00-abc-def-01"
    assert "x-secret-thing" not in received
    assert "authorization" not in received  # the worker has no key of its own


def test_a_forwarded_header_a_worker_would_refuse_is_not_passed_on() -> None:
    # Servers refuse control characters in a head; a scope that carries one anyway (found by the
    # hostile suite driving the app directly) must not make the gateway write an invalid head.
    scope = {"headers": [(b"traceparent", b"00-ok-01"), (b"x-request-id-extra", b"\xc5\x14\xf7("),
                         (b"x-correlation-id", b"tab\tok"), (b"x-request-id-nul", b"a\x00b")]}
    assert forwarded_headers(scope) == (("traceparent", "00-ok-01"), ("x-correlation-id", "tab\tok"))


async def test_worker_key_is_presented_to_the_worker(make_gateway, start_worker) -> None:
    secured = await start_worker(api_key="sk-worker-secret")
    client = make_gateway([record_for(secured, api_key="sk-worker-secret")])
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert secured.requests()[-1]["headers"]["authorization"] == "Bearer sk-worker-secret"


async def test_streaming_chat_is_relayed_and_ends_with_done(gateway) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        lines = [line async for line in response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [orjson.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


async def test_streaming_completion_is_relayed(gateway) -> None:
    body = {"model": "mock-model", "prompt": "hi", "stream": True}
    async with gateway.stream("POST", "/v1/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line]
    assert response.status_code == 200
    assert lines[-1] == "data: [DONE]"
    assert orjson.loads(lines[0][6:])["object"] == "text_completion"


async def test_stream_cut_by_worker_still_ends_with_error_and_done(gateway) -> None:
    body = {**CHAT, "stream": True, "mock": {"fail_after": 2, "tokens": 10}}
    async with gateway.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line]
    assert response.status_code == 200
    assert lines[-1] == "data: [DONE]"
    assert orjson.loads(lines[-2][6:])["error"]["type"] == "internal_error"


async def test_worker_rejection_of_a_stream_comes_back_unchanged(gateway) -> None:
    body = {**CHAT, "stream": True, "mock": {"status": 422}}
    response = await gateway.post("/v1/chat/completions", json=body)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/json")
    assert "x-gw-error-code" not in response.headers  # the worker's error, not the gateway's
    assert response.json()["error"]["code"] == 422 or response.json()["error"]


async def test_worker_error_on_json_request_comes_back_unchanged(gateway) -> None:
    response = await gateway.post("/v1/chat/completions", json={**CHAT, "mock": {"status": 500}})
    assert response.status_code == 500
    assert "error" in response.json()


async def test_round_robin_spreads_requests(make_gateway, start_worker) -> None:
    first, second = await start_worker(), await start_worker()
    client = make_gateway([record_for(first), record_for(second)], policy="round_robin")
    for _ in range(4):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert len(first.requests()) == 2 and len(second.requests()) == 2


async def test_model_picks_the_worker_serving_it(make_gateway, start_worker) -> None:
    llama, qwen = await start_worker(model="llama"), await start_worker(model="qwen")
    client = make_gateway([record_for(llama), record_for(qwen)])
    await client.post("/v1/chat/completions", json={**CHAT, "model": "qwen"})
    assert not llama.requests() and len(qwen.requests()) == 1


async def test_unreachable_worker_gives_502_envelope(make_gateway) -> None:
    client = make_gateway([record_for("http://127.0.0.1:9", model="mock-model")])
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert response.headers["x-gw-error-code"] == "upstream_unavailable"
    assert response.json()["error"]["code"] == "upstream_unavailable"


async def test_in_flight_count_returns_to_zero(make_gateway, worker: RunningWorker) -> None:
    record = record_for(worker)
    client = make_gateway([record])
    from inference.routing.registry import REGISTRY

    await client.post("/v1/chat/completions", json=CHAT)
    await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    await client.post("/v1/chat/completions", json={**CHAT, "mock": {"status": 500}})
    assert REGISTRY.snapshot.workers[0].load.in_flight == 0


async def test_no_database_query_on_the_request_path(make_gateway, worker: RunningWorker, monkeypatch) -> None:
    """Every relayed route, streaming or not, authenticated and rate limited, never touches the store
    (counted in every thread, since a query could hide behind sync_to_async)."""
    from django.db.backends import utils

    queries: list[str] = []
    original = utils.CursorWrapper._execute_with_wrappers

    def counting(self, sql, params, many, executor):  # type: ignore[no-untyped-def]
        queries.append(sql)
        return original(self, sql, params, many, executor)

    monkeypatch.setattr(utils.CursorWrapper, "_execute_with_wrappers", counting)
    client = make_gateway(
        [record_for(worker)], tenant_api_keys=(("acme", "sk-acme"),), tenant_rate_limits=(("acme", "1000"),),
        max_concurrent_requests=8,
    )
    headers = {"Authorization": "Bearer sk-acme"}
    for path, body in [
        ("/v1/chat/completions", CHAT), ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/completions", {"model": "mock-model", "prompt": "hi"}), ("/v1/embeddings", {"model": "mock-model", "input": "x"}),
        ("/v1/chat/completions", {"model": "unknown", "messages": CHAT["messages"]}),
    ]:
        await client.post(path, json=body, headers=headers)
    await client.get("/v1/models")
    await client.get("/readiness")
    assert queries == []


async def test_a_worker_of_a_transport_not_built_yet_gets_501_not_500(make_gateway) -> None:
    # An engine worker whose runtime has no client over its transport (a gRPC sglang worker is one the
    # gateway serves: unreachable, it answers 503 tokenizer_not_ready instead).
    engine = dataclasses.replace(record_for("grpc://127.0.0.1:50051", model="mock-model"), runtime_type="generic")
    client = make_gateway([engine])
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 501
    assert response.headers["x-gw-error-code"] == "endpoint_not_supported"
