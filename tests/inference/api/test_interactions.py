"""POST /v1/interactions (spec 1, Endpoints; docs ENGINES.md: Gemini's Interactions API): relayed only
to the Gemini provider (our stand-in Gemini API on loopback, which checks its Bearer key and records
what it received), with the worker's own key and the client's tracing headers, never a gateway key;
streams relayed as they arrive without a sentinel; the provider's errors passed on; 501 on HTTP
workers and on every other provider."""

from __future__ import annotations

import json
import uuid
from typing import AsyncIterator

import orjson
import pytest

from inference.routing.workers import WorkerRecord, WorkerStatus
from standins.mock_provider import ProviderConfig
from tests.conftest import PROVIDER_KEY, GatewayFactory, Provider, RunningWorker, record_for, serving_provider

GATEWAY_KEY = "gw-secret-key"
MODEL = "gemini-2.5-flash"
AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}
TRACING = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "vendor=1"}


def external(provider: Provider, named: str, models: tuple[str, ...] = (MODEL,)) -> WorkerRecord:
    return WorkerRecord(
        id=str(uuid.uuid4()), url=provider.url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key=PROVIDER_KEY, models=models, named_provider=named,
    )  # fmt: skip


@pytest.fixture
async def gemini() -> AsyncIterator[Provider]:
    config = ProviderConfig(models=(MODEL,), api_key=PROVIDER_KEY, flavour="gemini")
    async with serving_provider(config) as running:
        yield running


def received(provider: Provider) -> dict[str, object]:
    return provider.calls("/v1/interactions")[-1]


def assert_no_gateway_key(provider: Provider) -> None:
    for request in provider.state.requests:
        assert GATEWAY_KEY not in json.dumps(request["headers"]) and GATEWAY_KEY not in json.dumps(request["json"])


async def test_an_interaction_is_relayed_to_gemini_with_its_key_and_tracing(make_gateway: GatewayFactory, gemini: Provider) -> None:
    client = make_gateway([external(gemini, "gemini")], api_key=GATEWAY_KEY, ssrf_allow_loopback=True)
    body = {"model": MODEL, "input": "hello there", "generation_config": {"temperature": 0.5}}
    response = await client.post("/v1/interactions", json=body, headers={**AUTH, **TRACING, "x-api-key": "dropped"})
    assert response.status_code == 200
    interaction = response.json()
    assert interaction["object"] == "interaction" and interaction["outputs"] == [{"type": "text", "text": "heard: hello there"}]
    sent = received(gemini)
    assert sent["json"] == body
    own = {"host", "content-length", "content-type", "x-request-id", "accept"}
    headers = {name: value for name, value in sent["headers"].items() if name not in own}  # type: ignore[attr-defined]
    assert headers == {"authorization": f"Bearer {PROVIDER_KEY}", **TRACING}
    assert_no_gateway_key(gemini)


async def test_a_stream_is_relayed_as_gemini_sends_it(make_gateway: GatewayFactory, gemini: Provider) -> None:
    client = make_gateway([external(gemini, "gemini")], api_key=GATEWAY_KEY, ssrf_allow_loopback=True)
    body = {"model": MODEL, "input": "stream me", "stream": True}
    async with client.stream("POST", "/v1/interactions", json=body, headers=AUTH) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in response.aiter_bytes()])
    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    kinds = [event["event_type"] for event in events]
    assert kinds[0] == "interaction.start" and kinds[-1] == "interaction.complete"  # no [DONE] added
    assert "".join(event["delta"]["text"] for event in events if event["event_type"] == "content.delta") == "heard: stream me"
    assert b"[DONE]" not in raw


async def test_geminis_errors_come_back_with_their_status_and_body(make_gateway: GatewayFactory, gemini: Provider) -> None:
    client = make_gateway([external(gemini, "gemini", models=("gemini-unknown",))], ssrf_allow_loopback=True)
    response = await client.post("/v1/interactions", json={"model": "gemini-unknown", "input": "hi"})
    assert response.status_code == 404
    assert response.json() == {"error": {"code": 404, "message": "models/gemini-unknown is not found.", "status": "NOT_FOUND"}}


async def test_every_other_worker_kind_and_provider_answers_501(
    make_gateway: GatewayFactory, worker: RunningWorker, provider: Provider
) -> None:
    for records, model in (([record_for(worker)], worker.model), ([external(provider, "openai", ("gpt-4o-mini",))], "gpt-4o-mini")):
        client = make_gateway(records, ssrf_allow_loopback=True)
        response = await client.post("/v1/interactions", json={"model": model, "input": "hi"})
        assert response.status_code == 501 and response.json()["error"]["code"] == "endpoint_not_supported"
    assert provider.calls("/v1/interactions") == [] and list(worker.state.requests) == []
