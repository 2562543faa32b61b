"""POST /v1/messages and /v1/messages/count_tokens on HTTP workers (spec 1, "Messages-style API",
"Token counting", "Endpoints" and the messages header paragraphs, "Events", "Errors"): relayed to
the worker's own routes with exactly the messages header set, read with the real anthropic SDK (in
strict mode, so its own parser must accept every answer and event). Engine workers are served by the
gateway itself: tests/inference/served/test_messages.py and test_count_tokens.py."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import httpx2
import orjson
import pytest

from gateway_project.asgi import application
from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, record_for

GATEWAY_KEY = "sk-gateway-key"
BODY: dict[str, Any] = {"model": "mock-model", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello there"}]}

pytestmark = pytest.mark.django_db


def sdk(**auth: str) -> anthropic.AsyncAnthropic:
    """The SDK on the in-process gateway. ``auth_token=`` and (in 2.x) ``api_key=`` send Authorization:
    Bearer; ``x_api_key=`` sends the older x-api-key header the SDK still accepts as credentials."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url="http://gateway", timeout=30)
    x_api_key = auth.pop("x_api_key", None)
    headers = {"x-api-key": x_api_key} if x_api_key else None
    return anthropic.AsyncAnthropic(base_url="http://gateway", http_client=http, max_retries=0, default_headers=headers,
                                    _strict_response_validation=True, **auth)  # type: ignore[arg-type]  # fmt: skip


@pytest.fixture
def gateway(make_gateway: GatewayFactory, worker: RunningWorker) -> httpx.AsyncClient:
    return make_gateway([record_for(worker)], model_aliases=(("fast", worker.model),))


def last(worker: RunningWorker, path: str = "/v1/messages") -> dict[str, Any]:
    return [request for request in worker.requests() if request["path"] == path][-1]


async def test_a_whole_message_is_relayed_and_read_by_the_sdk(gateway: httpx.AsyncClient, worker: RunningWorker) -> None:
    client = sdk(auth_token="unused-when-auth-is-off")
    message = await client.messages.create(model="fast", max_tokens=4, messages=[{"role": "user", "content": "Hello"}])
    assert message.content[0].type == "text" and message.content[0].text == "tok0 tok1 tok2 tok3"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4
    assert last(worker)["json"]["model"] == "mock-model"  # the alias replaced by the canonical model


async def test_a_stream_is_relayed_with_its_events_and_parsed_by_the_sdk(gateway: httpx.AsyncClient) -> None:
    client = sdk(api_key="sk-client")
    async with client.messages.stream(model="mock-model", max_tokens=3, messages=[{"role": "user", "content": "Hi"}]) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "tok0 tok1 tok2"
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)


async def test_the_raw_stream_keeps_every_event_line_and_has_no_done(gateway: httpx.AsyncClient) -> None:
    async with gateway.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        text = (await response.aread()).decode()
    events = [block for block in text.split("\n\n") if block]
    assert all(block.startswith("event: ") and "\ndata: " in block for block in events)
    assert events[0].startswith("event: message_start") and events[-1].startswith("event: message_stop")
    assert "event: ping" in text and "[DONE]" not in text


async def test_create_with_stream_true_is_parsed_by_the_sdk(gateway: httpx.AsyncClient) -> None:
    client = sdk(auth_token="t")
    stream = await client.messages.create(model="mock-model", max_tokens=2, stream=True, messages=[{"role": "user", "content": "Hi"}])
    texts = [event.delta.text async for event in stream if event.type == "content_block_delta" and event.delta.type == "text_delta"]
    assert "".join(texts) == "tok0 tok1"


async def test_exactly_the_messages_header_set_reaches_the_worker(gateway: httpx.AsyncClient, worker: RunningWorker) -> None:
    headers = {
        "Authorization": "Bearer client-token", "x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01",
        "anthropic-beta": "tools-2024-04-04", "x-request-id": "rid-1", "x-request-id-extra": "e",
        "x-correlation-id": "c-1", "traceparent": "00-abc-def-01", "tracestate": "k=v", "x-gw-routing-key": "r",
        "x-secret-thing": "no", "cookie": "a=b", "Content-Type": "application/json; charset=utf-8",
    }  # fmt: skip
    response = await gateway.post("/v1/messages", json=BODY, headers=headers)
    assert response.status_code == 200
    received = last(worker)["headers"]
    forwarded = {"authorization": "Bearer client-token", "anthropic-version": "2023-06-01",
                 "anthropic-beta": "tools-2024-04-04", "x-request-id": "rid-1", "x-request-id-extra": "e",
                 "x-correlation-id": "c-1", "traceparent": "00-abc-def-01", "tracestate": "k=v",
                 "x-gw-routing-key": "r", "content-type": "application/json"}  # fmt: skip
    transport = {"host", "content-length"}
    assert {name: received[name] for name in received if name not in transport} == forwarded


async def test_both_sdk_header_styles_reach_the_worker_as_the_spec_says(gateway: httpx.AsyncClient, worker: RunningWorker) -> None:
    await sdk(auth_token="bearer-style").messages.create(**BODY)
    bearer = last(worker)["headers"]
    assert bearer["authorization"] == "Bearer bearer-style" and bearer["anthropic-version"]
    await sdk(x_api_key="sk-ant-key-style").messages.create(**BODY)
    keyed = last(worker)["headers"]
    assert "x-api-key" not in keyed and "authorization" not in keyed and keyed["anthropic-version"]


async def test_a_worker_with_its_own_key_gets_its_key_not_the_callers(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    secured = await start_worker(api_key="sk-worker-secret")
    client = make_gateway([record_for(secured, api_key="sk-worker-secret")], api_key=GATEWAY_KEY)
    response = await client.post("/v1/messages", json=BODY, headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
    assert response.status_code == 200
    received = last(secured)["headers"]
    assert received["authorization"] == "Bearer sk-worker-secret"
    assert GATEWAY_KEY not in orjson.dumps(received).decode()


async def test_the_callers_authorization_goes_to_a_worker_without_a_key(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    # The spec's header set for messages forwards Authorization (gateway key included) to HTTP workers.
    client = make_gateway([record_for(worker)], api_key=GATEWAY_KEY)
    client_sdk = sdk(auth_token=GATEWAY_KEY)
    await client_sdk.messages.create(**BODY)
    assert last(worker)["headers"]["authorization"] == f"Bearer {GATEWAY_KEY}"
    assert (await client.post("/v1/messages", json=BODY)).status_code == 401


async def test_unmodelled_fields_and_number_values_are_forwarded_unchanged(gateway: httpx.AsyncClient, worker: RunningWorker) -> None:
    raw = (b'{"model": "mock-model", "max_tokens": 4, "temperature": 0.50, "context_management": {"edits": []},'
           b' "output_config": {"effort": "low"}, "messages": [{"role": "user", "content": "Hi"}]}')  # fmt: skip
    response = await gateway.post("/v1/messages", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    assert last(worker)["raw"] == raw.decode()  # not rewritten: no alias to replace


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_worker_errors_come_back_with_status_and_body_unchanged(gateway: httpx.AsyncClient, status: int) -> None:
    body = {**BODY, "mock": {"status": status}}
    response = await gateway.post("/v1/messages", json=body)
    assert response.status_code == status
    assert response.json() == {"error": {"message": f"mock error (status {status})", "type": response.json()["error"]["type"],
                                         "param": None, "code": status}}  # fmt: skip
    assert "x-gw-error-code" not in response.headers  # the worker's, not the gateway's


async def test_a_worker_error_on_a_stream_comes_back_unchanged(gateway: httpx.AsyncClient) -> None:
    response = await gateway.post("/v1/messages", json={**BODY, "stream": True, "mock": {"status": 422}})
    assert response.status_code == 422 and response.headers["content-type"].startswith("application/json")


async def test_a_stream_that_breaks_after_it_started_ends_with_the_anthropic_error_event(gateway: httpx.AsyncClient) -> None:
    body = {**BODY, "max_tokens": 8, "stream": True, "mock": {"fail_after": 2}}
    async with gateway.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        text = (await response.aread()).decode()
    last_event = [block for block in text.split("\n\n") if block][-1]
    kind, data = last_event.split("\n")
    assert kind == "event: error"
    payload = orjson.loads(data.removeprefix("data: "))
    assert payload["type"] == "error" and payload["error"]["type"] == "api_error" and payload["error"]["message"]
    assert "[DONE]" not in text and "message_stop" not in text


async def test_the_sdk_raises_on_the_error_event(gateway: httpx.AsyncClient) -> None:
    client = sdk(auth_token="t")
    with pytest.raises(anthropic.APIStatusError):
        async with client.messages.stream(**{**BODY, "max_tokens": 8}, metadata={"user_id": "u"},
                                          extra_body={"mock": {"fail_after": 2}}) as stream:  # fmt: skip
            async for _event in stream:
                pass


async def test_validation_errors_use_the_standard_envelope(gateway: httpx.AsyncClient, worker: RunningWorker) -> None:
    zero = await gateway.post("/v1/messages", json={**BODY, "max_tokens": 0})
    assert zero.status_code == 400 and zero.json()["error"]["code"] == 400
    assert zero.json()["error"]["type"] == "invalid_request_error"
    missing = await gateway.post("/v1/messages", json={"model": "mock-model", "max_tokens": 4})
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "json_parse_error"
    streamed = await gateway.post("/v1/messages", json={**BODY, "stream": True, "messages": []})
    assert streamed.status_code == 400 and streamed.json()["error"]["code"] == 400  # before the stream: an HTTP error
    assert not [r for r in worker.requests() if r["path"].startswith("/v1/messages")]


async def test_an_unknown_model_is_404_before_any_worker(gateway: httpx.AsyncClient) -> None:
    response = await gateway.post("/v1/messages", json={**BODY, "model": "no-such-model"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


async def test_count_tokens_is_relayed_to_the_workers_route(gateway: httpx.AsyncClient, worker: RunningWorker) -> None:
    client = sdk(api_key="sk-client")
    counted = await client.messages.count_tokens(
        model="fast", system="be brief", messages=[{"role": "user", "content": "one two three"}],
        extra_headers={"anthropic-beta": "token-counting-2024-11-01"},
    )  # fmt: skip
    assert counted.input_tokens == 5
    sent = last(worker, "/v1/messages/count_tokens")
    assert sent["json"]["model"] == "mock-model" and sent["headers"]["anthropic-beta"] == "token-counting-2024-11-01"
    assert "x-api-key" not in sent["headers"]
    missing = await gateway.post("/v1/messages/count_tokens", json={"model": "mock-model"})
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "json_parse_error"
