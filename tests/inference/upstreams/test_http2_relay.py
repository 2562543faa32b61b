"""The HTTP relay over HTTP/2 with prior knowledge (h2c; spec 3's http_pool.http2, D111), against a
worker speaking real HTTP/2 (standins/h2_worker.py: the ``h2`` package in front of the mock worker):
the openai SDK through the gateway, streamed and whole, a client that leaves (RST_STREAM CANCEL), a
worker that drops the connection, flow control past the windows, the gauge; and registration:
http2 true on a worker speaking only HTTP/1.1 fails with the reason, --upstream-http2 probes and
prefers HTTP/2, the read model's ``http2`` says what is used."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, AsyncIterator

import httpx
import openai
import orjson
import pytest
from django.test import AsyncClient
from django.utils import timezone

from administration.models import Worker
from administration.registration import RegistrationFailed, _http2_choice
from administration.workers import worker_fields, worker_records
from common.config import GatewayConfig
from common.worker_metrics import http2_of
from gateway_project.asgi import application
from inference.routing.registry import REGISTRY
from standins.h2_worker import H2Front
from tests.administration.fleet import running_fleet
from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, free_port, record_for, until


@dataclasses.dataclass
class H2Worker:
    url: str
    front: H2Front
    inner: RunningWorker


@pytest.fixture
async def start_h2_worker(start_worker: WorkerFactory) -> AsyncIterator[Any]:
    fronts: list[H2Front] = []

    async def start(drop_after: int | None = None, **options: Any) -> H2Worker:
        inner = await start_worker(**options)
        front = H2Front(int(inner.url.rsplit(":", 1)[1]), drop_after=drop_after)
        port = await front.start()
        fronts.append(front)
        return H2Worker(f"http://127.0.0.1:{port}", front, inner)

    yield start
    for front in fronts:
        await front.close()


def h2_record(worker: H2Worker) -> Any:
    return dataclasses.replace(record_for(worker.url, worker.inner.model), http2=True)


def sdk(gateway: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="x", http_client=gateway, max_retries=0)


async def test_chat_whole_and_streamed_over_http2(make_gateway: GatewayFactory, start_h2_worker: Any) -> None:
    worker = await start_h2_worker()
    client = sdk(make_gateway([h2_record(worker)]))
    whole = await client.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "hi"}])
    assert whole.choices[0].message.content and whole.usage is not None and whole.usage.completion_tokens > 0
    stream = await client.chat.completions.create(
        model="mock-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    assert worker.front.h2_streams == 2 and worker.front.connections == 1  # one connection, two streams
    relayed = [r for r in worker.inner.requests() if r["path"] == "/v1/chat/completions"]
    assert len(relayed) == 2 and relayed[1]["headers"]["accept"] == "text/event-stream"
    assert relayed[0]["headers"]["x-request-id"]


async def test_status_body_and_content_type_are_relayed(make_gateway: GatewayFactory, start_h2_worker: Any) -> None:
    worker = await start_h2_worker()
    gateway = make_gateway([h2_record(worker)])
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"status": 429}}
    answer = await gateway.post("/v1/chat/completions", json=body)
    assert answer.status_code == 429 and answer.headers["content-type"].startswith("application/json")
    assert "error" in answer.json()


async def test_a_large_answer_passes_the_windows(make_gateway: GatewayFactory, start_h2_worker: Any) -> None:
    """An answer several times the stream's receive window: the relay gives the window back as it
    reads (the worker waits for WINDOW_UPDATE), streamed and whole."""
    worker = await start_h2_worker(max_model_len=200_000)
    gateway = make_gateway([h2_record(worker)])
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000,
            "mock": {"tokens": 100_000}}  # fmt: skip
    whole = await gateway.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 100_000
    assert len(whole.content) > 3 * 256 * 1024  # past the held window and the stream's receive window
    body = {**body, "max_tokens": 10_000, "mock": {"tokens": 10_000}}
    async with gateway.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
        text = b"".join([part async for part in streamed.aiter_bytes()])
    assert streamed.status_code == 200 and text.rstrip().endswith(b"data: [DONE]") and len(text) > 1_000_000


async def test_a_client_that_leaves_resets_the_stream(make_gateway: GatewayFactory, start_h2_worker: Any) -> None:
    worker = await start_h2_worker()
    gateway = make_gateway([h2_record(worker)])
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "mock": {"tokens": 500, "delay_ms": 20}}  # fmt: skip
    first_chunk = asyncio.Event()
    messages = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await first_chunk.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and b"content" in message.get("body", b""):
            first_chunk.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
    }  # fmt: skip
    await asyncio.wait_for(application(scope, receive, send), 5)

    async def reset() -> bool:
        return worker.front.resets == 1 and worker.inner.state.stats()["streams_disconnected"] == 1

    await until(reset)
    body = {**body, "stream": False, "mock": {"tokens": 3}}
    again = await gateway.post("/v1/chat/completions", json=body)
    assert again.status_code == 200 and worker.front.connections == 1  # the connection stayed up


async def test_a_dropped_connection_is_a_502_or_an_in_band_error(
    make_gateway: GatewayFactory, start_h2_worker: Any
) -> None:
    worker = await start_h2_worker(drop_after=3, max_model_len=100_000)
    gateway = make_gateway([h2_record(worker)])
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"tokens": 20, "delay_ms": 5}}
    async with gateway.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
        text = b"".join([part async for part in streamed.aiter_bytes()])
    # The stream had started: the failure in-band, as on HTTP/1.1 (an error event, then the end).
    assert streamed.status_code == 200 and b'data: {"error":{"message":"Worker stream failed' in text
    # Whole (about 215 KB, within the held window): the connection drops before its end, nothing was
    # sent yet: 502, as on HTTP/1.1.
    whole = await gateway.post("/v1/chat/completions", json={**body, "mock": {"tokens": 25000}, "max_tokens": 25000})
    assert whole.status_code == 502


async def test_a_worker_not_listening_is_a_connect_failure(make_gateway: GatewayFactory) -> None:
    record = dataclasses.replace(record_for(f"http://127.0.0.1:{free_port()}", "mock-model"), http2=True)
    answer = await make_gateway([record]).post(
        "/v1/chat/completions", json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert answer.status_code == 502


def test_the_gauge_says_http2_for_an_http_worker_that_uses_it() -> None:
    assert http2_of("http", True) == 1 and http2_of("http", False) == 0 and http2_of("grpc") == 1


# -- registration -----------------------------------------------------------------------------------

FAST = dict(worker_startup_check_interval=0.2, worker_startup_timeout_secs=1.0, health_check_interval_secs=0.2,
            health_success_threshold=1)  # fmt: skip


async def _register(api: AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await api.post("/workers", body, content_type="application/json")
    assert response.status_code == 202, response.content
    location = response.json()["location"]

    async def ready() -> bool:
        got = await api.get(location)
        return got.status_code == 200 and got.json()["status"] == "ready" and "job_status" not in got.json()

    await until(ready)
    return (await api.get(location)).json()


async def _relayed_over(worker: H2Worker | RunningWorker, url: str) -> None:
    async def listed() -> bool:
        return any(handle.record.url == url for handle in REGISTRY.snapshot.workers)

    await until(listed)


@pytest.mark.django_db(transaction=True)
async def test_registration_with_http2_true_uses_it(start_h2_worker: Any) -> None:
    worker = await start_h2_worker()
    api = AsyncClient()
    async with running_fleet(GatewayConfig(**FAST)):  # type: ignore[arg-type]
        got = await _register(api, {"url": worker.url, "http_pool": {"http2": True}})
        assert got["http2"] is True
        await _relayed_over(worker, worker.url)
        record = next(h.record for h in REGISTRY.snapshot.workers if h.record.url == worker.url)
        assert record.http2


@pytest.mark.escapes_expected  # the HTTP/1.1 worker (aiohttp) logs the HTTP/2 preface as a bad request
@pytest.mark.django_db(transaction=True)
async def test_http2_true_on_a_worker_speaking_only_http11_fails_its_registration(
    start_worker: WorkerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    worker = await start_worker()
    api = AsyncClient()
    caplog.set_level(logging.ERROR, logger="administration.registration")
    async with running_fleet(GatewayConfig(**FAST)):  # type: ignore[arg-type]
        response = await api.post("/workers", {"url": worker.url, "http_pool": {"http2": True}},
                                  content_type="application/json")  # fmt: skip
        location = response.json()["location"]

        async def released() -> bool:
            return (await api.get(location)).status_code == 404

        await until(released)
        assert "http_pool.http2 true but the worker speaks only HTTP/1.1" in caplog.text
        # A replacement (PUT) of a registered worker keeps the failure in its job_status.
        got = await _register(api, {"url": worker.url})
        assert got["http2"] is False
        put = await api.put(f"/workers/{got['id']}", {"url": worker.url, "http_pool": {"http2": True}},
                            content_type="application/json")  # fmt: skip
        assert put.status_code == 202

        async def failed() -> bool:
            return (await api.get(f"/workers/{got['id']}")).json().get("job_status", {}).get("status") == "failed"

        await until(failed)
        message = (await api.get(f"/workers/{got['id']}")).json()["job_status"]["message"]
        assert "http_pool.http2 true but the worker speaks only HTTP/1.1" in message


@pytest.mark.escapes_expected  # the HTTP/1.1 worker (aiohttp) logs the HTTP/2 probe as a bad request
@pytest.mark.django_db(transaction=True)
async def test_upstream_http2_probes_and_prefers_http2(start_h2_worker: Any, start_worker: WorkerFactory) -> None:
    h2_worker = await start_h2_worker()
    plain = await start_worker()
    api = AsyncClient()
    async with running_fleet(GatewayConfig(upstream_http2=True, **FAST)):  # type: ignore[arg-type]
        assert (await _register(api, {"url": h2_worker.url}))["http2"] is True
        assert (await _register(api, {"url": plain.url}))["http2"] is False  # fell back to HTTP/1.1
        told = await start_h2_worker()
        assert (await _register(api, {"url": told.url, "http_pool": {"http2": False}}))["http2"] is False
        assert told.front.h2_streams == 0 and told.front.connections > 0  # probed over HTTP/1.1 only
    async with running_fleet(GatewayConfig(**FAST)):  # type: ignore[arg-type]
        other = await start_h2_worker()
        assert (await _register(api, {"url": other.url}))["http2"] is False  # without the flag: HTTP/1.1


async def test_many_streams_share_one_connection(make_gateway: GatewayFactory, start_h2_worker: Any) -> None:
    worker = await start_h2_worker()
    gateway = make_gateway([h2_record(worker)])
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"tokens": 5, "delay_ms": 5}}
    answers = await asyncio.gather(*(gateway.post("/v1/chat/completions", json=body) for _ in range(8)))
    assert all(answer.status_code == 200 for answer in answers)
    assert worker.front.h2_streams == 8 and worker.front.connections == 1


async def test_the_request_timeout_is_a_504_or_ends_the_stream_in_band(
    make_gateway: GatewayFactory, start_h2_worker: Any
) -> None:
    worker = await start_h2_worker()
    gateway = make_gateway([h2_record(worker)], request_timeout_secs=0.6, retry_max_retries=0)
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"tokens": 40, "delay_ms": 50}}
    whole = await gateway.post("/v1/chat/completions", json=body)
    assert whole.status_code == 504 and whole.headers["x-gw-error-code"] == "upstream_timeout"
    async with gateway.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
        text = b"".join([part async for part in streamed.aiter_bytes()])
    assert streamed.status_code == 200 and b"timed out" in text and 0 < text.count(b'"content"') < 40

    async def reset() -> bool:
        return worker.front.resets == 2  # each stream past the deadline was reset, the connection kept

    await until(reset)
    assert worker.front.connections == 1


async def test_a_request_body_past_the_peers_window_waits_for_it(
    make_gateway: GatewayFactory, start_h2_worker: Any
) -> None:
    """A 300 KB prompt against the worker's 64 KiB initial windows: sent as its WINDOW_UPDATEs admit it."""
    worker = await start_h2_worker(max_model_len=1_000_000)
    gateway = make_gateway([h2_record(worker)])
    content = "word " * 60_000
    answer = await gateway.post(
        "/v1/chat/completions", json={"model": "mock-model", "messages": [{"role": "user", "content": content}]}
    )
    assert answer.status_code == 200
    relayed = [r for r in worker.inner.requests() if r["path"] == "/v1/chat/completions"]
    assert relayed[-1]["json"]["messages"][0]["content"] == content


def test_http2_true_on_an_https_worker_fails_saying_tls_is_not_done() -> None:
    with pytest.raises(RegistrationFailed, match="HTTP/2 over TLS"):
        _http2_choice(Worker(url="https://127.0.0.1:1", settings={"http_pool": {"http2": True}}))
    assert _http2_choice(Worker(url="https://127.0.0.1:1", settings={})) is False


@pytest.mark.django_db(transaction=True)
async def test_put_applies_http2_and_patch_leaves_it(start_h2_worker: Any) -> None:
    """http_pool is a field PATCH ignores (spec 3: "use PUT"): a PATCH naming http2 changes only its
    PATCH fields, the row's block and the relay's choice stay; a PUT with it registers again, probing
    the worker, and the relay then speaks HTTP/2 to it."""
    worker = await start_h2_worker()
    api = AsyncClient()
    async with running_fleet(GatewayConfig(**FAST)):  # type: ignore[arg-type]
        got = await _register(api, {"url": worker.url})
        assert got["http2"] is False
        patch = await api.patch(f"/workers/{got['id']}", {"priority": 7, "http_pool": {"http2": True}},
                                content_type="application/json")  # fmt: skip
        assert patch.status_code == 202

        async def patched() -> bool:
            seen = (await api.get(f"/workers/{got['id']}")).json()
            return seen.get("priority") == 7 and "job_status" not in seen

        await until(patched)
        assert (await api.get(f"/workers/{got['id']}")).json()["http2"] is False
        row = await Worker.objects.aget(pk=got["id"])
        assert "http_pool" not in row.settings
        assert not next(h.record for h in REGISTRY.snapshot.workers if h.record.url == worker.url).http2
        put = await api.put(f"/workers/{got['id']}", {"url": worker.url, "http_pool": {"http2": True}},
                            content_type="application/json")  # fmt: skip
        assert put.status_code == 202

        async def over_http2() -> bool:
            return any(h.record.url == worker.url and h.record.http2 for h in REGISTRY.snapshot.workers)

        await until(over_http2)
        assert (await api.get(f"/workers/{got['id']}")).json()["http2"] is True


def test_the_api_says_what_the_gauge_says() -> None:
    """GET /workers' http2 and gw_worker_http2 are one fact: gRPC workers are reached over HTTP/2,
    relayed HTTP workers as registration chose, external providers and ZMQ workers over neither."""
    config = GatewayConfig()
    rows = [
        Worker(url="http://127.0.0.1:1", runtime_type="sglang", settings={"http2_used": True}),
        Worker(url="http://127.0.0.1:2", runtime_type="sglang", settings={"http2_used": False}),
        Worker(url="http://127.0.0.1:3", runtime_type="sglang", settings={}),
        Worker(url="grpc://127.0.0.1:4", runtime_type="sglang", settings={}),
        Worker(url="https://api.openai.com", runtime_type="external", settings={"http2_used": True}),
        Worker(url="zmq://127.0.0.1:5", runtime_type="vllm", settings={}),
    ]
    for row in rows:
        row.created_at = timezone.now()
    api = [worker_fields(row, config)["http2"] for row in rows]
    gauge = [http2_of(record.transport, record.http2) == 1 for record in worker_records(config, rows)]
    assert api == gauge == [True, False, False, True, False, False]
