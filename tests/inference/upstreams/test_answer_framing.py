"""Issue 22, item 3: never an empty 200. A worker or provider may end its answer's body by closing
the connection (HTTP/1.1 with neither Content-Length nor chunked coding, or HTTP/1.0): the gateway
reads such bodies to the close, whole and streamed, on the relay, on a provider's Responses turn and
on health and load requests, exactly as it reads chunked and length-framed ones. A body it could not
read (cut short of its length or its last chunk) is a 502, never a 200 with nothing. Every worker
here is a raw asyncio server on loopback (tests/framed_worker.py), so the framing is exactly the
one named."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import orjson
import pytest

from administration.discovery import discover_http_worker, discover_provider
from administration.worker_clients import WorkerClients
from common.ssrf import SsrfPolicy
from inference.routing.workers import WorkerRecord, WorkerStatus
from tests.conftest import GatewayFactory, record_for
from tests.framed_worker import CHAT_ANSWER, STREAM_EVENTS, framed_worker

CHAT = {"model": "framed-model", "messages": [{"role": "user", "content": "hi"}]}
FRAMINGS = [
    pytest.param("close", b"HTTP/1.1", id="close-delimited HTTP/1.1"),
    pytest.param("close", b"HTTP/1.0", id="HTTP/1.0"),
    pytest.param("chunked", b"HTTP/1.1", id="chunked"),
    pytest.param("length", b"HTTP/1.1", id="content-length"),
]


@pytest.mark.parametrize(("framing", "version"), FRAMINGS)
async def test_whole_and_streamed_answers_arrive_whole_in_every_framing(
    make_gateway: GatewayFactory, framing: str, version: bytes
) -> None:
    async with framed_worker(framing, version=version) as worker:  # type: ignore[arg-type]
        client = make_gateway([record_for(worker.url, model="framed-model")], disable_retries=True)
        for _ in range(2):  # the second request comes on a new connection when the first was closed
            whole = await client.post("/v1/chat/completions", json=CHAT)
            assert whole.status_code == 200 and whole.content == CHAT_ANSWER
            assert whole.headers["content-length"] == str(len(CHAT_ANSWER))
            streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
            assert streamed.content == b"".join(STREAM_EVENTS)  # every event, [DONE] once, no in-band error
        assert worker.connections == (4 if framing == "close" else 1)


@pytest.mark.parametrize("framing", ["chunked", "length"])
async def test_a_body_cut_short_is_a_502_whole_and_an_in_band_error_streamed(
    make_gateway: GatewayFactory, framing: str
) -> None:
    async with framed_worker(framing, cut=True) as worker:  # type: ignore[arg-type]
        client = make_gateway([record_for(worker.url, model="framed-model")], disable_retries=True)
        whole = await client.post("/v1/chat/completions", json=CHAT)
        assert whole.status_code == 502 and whole.json()["error"]["code"] == "upstream_unavailable"
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        lines = [line for line in streamed.text.splitlines() if line]
        assert streamed.status_code == 200 and lines[-1] == "data: [DONE]"
        assert orjson.loads(lines[-2].removeprefix("data: "))["error"]["type"] == "internal_error"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("framing", "version"), FRAMINGS)
async def test_a_provider_responses_turn_is_read_to_the_close(
    make_gateway: GatewayFactory, framing: str, version: bytes
) -> None:
    async with framed_worker(framing, version=version) as provider:  # type: ignore[arg-type]
        record = WorkerRecord(
            id=str(uuid.uuid4()), url=provider.url, model_id=None, runtime_type="external",
            status=WorkerStatus.READY, api_key="sk-provider", models=("framed-model",),
        )  # fmt: skip
        client = make_gateway([record], ssrf_allow_loopback=True, history_backend="memory")
        answer = await client.post("/v1/responses", json={"model": "framed-model", "input": "hi"})
        assert answer.status_code == 200, answer.text
        response = answer.json()
        assert response["status"] == "completed" and response["output"][0]["content"][0]["text"] == "framed hello"
        streamed = await client.post("/v1/responses", json={"model": "framed-model", "input": "hi", "stream": True})
        events = [orjson.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "response.completed"
        assert provider.requests == [b"POST /v1/responses HTTP/1.1"] * 2


@pytest.mark.parametrize(("framing", "version"), FRAMINGS)
async def test_health_and_load_answers_are_read_to_the_close(framing: str, version: bytes) -> None:
    async with framed_worker(framing, version=version) as worker:  # type: ignore[arg-type]
        clients = WorkerClients(max_answer_bytes=1024)
        try:
            health = await clients.get(worker.url + "/health", {}, 5.0)
            load = await clients.get(worker.url + "/get_load", {}, 5.0)
        finally:
            await clients.aclose()
        assert health.ok and health.json() == {"status": "ok"}
        assert load.json() == {"num_reqs": 3, "num_waiting_reqs": 1}


async def test_discovery_reads_a_close_delimited_listing() -> None:
    """Registration's discovery (httpx, sync for HTTP workers; the SSRF guard's client for providers)."""
    async with framed_worker("close", version=b"HTTP/1.0") as worker:
        with httpx.Client(timeout=5) as client:
            found = await asyncio.to_thread(discover_http_worker, client, worker.url, None)
        assert found.model_ids == ("framed-model",) and found.runtime_type == "vllm"
        listed = await discover_provider(worker.url, "sk-provider", None, SsrfPolicy(allow_loopback=True))
        assert listed.model_ids == ("framed-model",)
