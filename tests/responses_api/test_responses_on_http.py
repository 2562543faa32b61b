"""POST /v1/responses on an HTTP worker (spec 2, per worker kind): relayed to the worker's own
/v1/responses unchanged, whole and streamed, read with the openai SDK in strict mode; the gateway
stores nothing, so the worker's response is not retrievable through it."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, free_port, record_for


def sdk(gateway: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="x", http_client=gateway,
                              _strict_response_validation=True, max_retries=0)  # fmt: skip


@pytest.mark.django_db(transaction=True)
async def test_an_http_worker_answers_responses_itself_and_the_gateway_stores_nothing(
    gateway: httpx.AsyncClient, worker: RunningWorker
) -> None:
    response = await sdk(gateway).responses.create(model=worker.model, input="hello there", max_output_tokens=512)
    assert response.status == "completed" and response.id.startswith("resp_")
    assert response.usage is not None and response.usage.output_tokens > 0
    assert response.output_text == " ".join(f"tok{i}" for i in range(response.usage.output_tokens))
    assert worker.state.requests[-1]["path"] == "/v1/responses"
    assert (await gateway.get(f"/v1/responses/{response.id}")).status_code == 404  # the worker's, not ours

    stream = await sdk(gateway).responses.create(model=worker.model, input="hello", max_output_tokens=512, stream=True)
    events = [event async for event in stream]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == response.output_text
    assert (await gateway.get(f"/v1/responses/{events[-1].response.id}")).status_code == 404

    cut = await sdk(gateway).responses.create(model=worker.model, input="hello", max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"


@pytest.mark.django_db(transaction=True)
async def test_cancel_of_an_http_workers_response_is_asked_of_every_http_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    first, second = await start_worker(), await start_worker()
    gateway = make_gateway([record_for(first), record_for(second)])
    client = sdk(gateway)
    made = await client.responses.create(model=first.model, input="hello", max_output_tokens=512)
    cancelled = await client.responses.cancel(made.id)  # one worker made it: its answer is the answer
    assert cancelled.id == made.id and cancelled.status == "cancelled"
    paths = [r["path"] for w in (first, second) for r in w.requests()]
    assert paths.count(f"/v1/responses/{made.id}/cancel") == 2
    with pytest.raises(openai.NotFoundError):  # nobody made it: the last error
        await client.responses.cancel("resp_unknown")


@pytest.mark.django_db(transaction=True)
async def test_cancel_when_no_http_worker_answers_is_502_in_the_standard_envelope(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway([record_for(f"http://127.0.0.1:{free_port()}", model="m")])
    response = await gateway.post("/v1/responses/resp_gone/cancel")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_unavailable" and error["type"] and "did not answer" in error["message"]
