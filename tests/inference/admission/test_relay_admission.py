"""Traffic control on the relay: queue full and timeout, tenant rate limits, the media budget, the
overhead header, and permits returning to zero after thousands of requests with random disconnects."""

from __future__ import annotations

import asyncio
import random
import uuid

import httpx

from inference.admission.rate_limit import RedisRateLimiter
from inference.dataplane import data_plane
from tests.conftest import ALICE, CHARLIE, SHARED_KEY, RunningWorker, post_scope, record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
SLOW = {**CHAT, "mock": {"tokens": 4, "delay_ms": 100}}
KEYS = {"tenant_api_keys": ((ALICE.tenant_id, ALICE.key), (CHARLIE.tenant_id, CHARLIE.key)), "api_key": SHARED_KEY}


def _isolate_rate_limits() -> None:
    """With REDIS_URL set the counters live in Redis: give this test keys of its own."""
    limiter = data_plane().rate_limiter
    if isinstance(limiter, RedisRateLimiter):
        limiter.prefix = f"gw:test:rl:{uuid.uuid4().hex}:"


def _image_chat(b64_chars: int) -> dict:
    url = "data:image/png;base64," + "A" * b64_chars
    content = [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": "mock-model", "messages": [{"role": "user", "content": content}]}


async def test_relayed_responses_carry_the_overhead_header(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)])
    whole = await gateway.post("/v1/chat/completions", json=CHAT)
    stream = await gateway.post("/v1/chat/completions", json={**CHAT, "stream": True})
    for response in (whole, stream):
        assert response.status_code == 200
        overhead = response.headers["x-gw-overhead-ms"]
        assert len(overhead.split(".")[1]) == 3
        assert 0.0 <= float(overhead) < 1000.0


async def test_overhead_excludes_waiting_on_the_worker(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)])
    response = await gateway.post("/v1/chat/completions", json=SLOW)  # ~400 ms upstream
    assert response.status_code == 200
    assert float(response.headers["x-gw-overhead-ms"]) < 200.0


async def test_no_free_permit_and_no_queue_gives_429(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], max_concurrent_requests=1, queue_size=0)
    slow = asyncio.create_task(gateway.post("/v1/chat/completions", json=SLOW))
    await asyncio.sleep(0.1)
    refused = await gateway.post("/v1/chat/completions", json=CHAT)
    assert refused.status_code == 429
    assert refused.headers["x-gw-error-code"] == "admission_queue_full"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert (await slow).status_code == 200
    assert data_plane().permits is not None and data_plane().permits.in_flight == 0


async def test_waiting_past_the_queue_timeout_gives_503(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], max_concurrent_requests=1, queue_size=5, queue_timeout_secs=0.05)
    slow = asyncio.create_task(gateway.post("/v1/chat/completions", json=SLOW))
    await asyncio.sleep(0.1)
    late = await gateway.post("/v1/chat/completions", json=CHAT)
    assert late.status_code == 503
    assert late.headers["x-gw-error-code"] == "admission_queue_timeout"
    assert (await slow).status_code == 200
    pool = data_plane().permits
    assert pool is not None and pool.in_flight == 0 and pool.queued == 0


async def test_queued_request_is_served_when_a_permit_frees(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], max_concurrent_requests=1, queue_size=5)
    responses = await asyncio.gather(*(gateway.post("/v1/chat/completions", json=CHAT) for _ in range(4)))
    assert [r.status_code for r in responses] == [200] * 4


async def test_permit_is_released_after_a_routing_error(make_gateway) -> None:
    gateway = make_gateway([], max_concurrent_requests=1, queue_size=0)  # no worker: refused after acquire
    for _ in range(3):
        response = await gateway.post("/v1/chat/completions", json=CHAT)
        assert response.headers["x-gw-error-code"] == "model_not_found"
    assert data_plane().permits is not None and data_plane().permits.in_flight == 0


async def test_permit_is_released_after_an_upstream_failure(make_gateway) -> None:
    gateway = make_gateway([record_for("http://127.0.0.1:1", model="mock-model")], max_concurrent_requests=1,
                           queue_size=0, disable_retries=True)
    for _ in range(3):
        response = await gateway.post("/v1/chat/completions", json=CHAT)
        assert response.headers["x-gw-error-code"] == "upstream_unavailable"
    assert data_plane().permits is not None and data_plane().permits.in_flight == 0


async def test_tenant_over_its_rate_limit_gets_429_with_headers(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], **KEYS, tenant_rate_limits=((ALICE.tenant_id, "2"),))
    _isolate_rate_limits()
    first = await gateway.post("/v1/chat/completions", json=CHAT, headers=ALICE.headers)
    second = await gateway.post("/v1/chat/completions", json=CHAT, headers=ALICE.headers)
    third = await gateway.post("/v1/chat/completions", json=CHAT, headers=ALICE.headers)
    assert first.status_code == second.status_code == 200
    assert first.headers["x-ratelimit-limit"] == "2"
    assert first.headers["x-ratelimit-remaining"] == "1"
    assert second.headers["x-ratelimit-remaining"] == "0"
    assert third.status_code == 429
    assert third.headers["x-gw-error-code"] == "rate_limit_exceeded"
    assert third.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(third.headers["retry-after"]) <= 60
    assert int(third.headers["x-ratelimit-reset"]) % 60 == 0
    assert third.headers["x-ratelimit-remaining"] == "0"
    # Another tenant (no limit set, default 0) and the shared key are not limited.
    other = await gateway.post("/v1/chat/completions", json=CHAT, headers=CHARLIE.headers)
    shared = await gateway.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {SHARED_KEY}"})
    assert other.status_code == shared.status_code == 200
    assert "x-ratelimit-limit" not in other.headers and "x-ratelimit-limit" not in shared.headers


async def test_default_tenant_limit_applies_to_every_tenant(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], **KEYS, default_tenant_rate_limit=1)
    _isolate_rate_limits()
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=CHARLIE.headers)).status_code == 200
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=CHARLIE.headers)).status_code == 429
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=ALICE.headers)).status_code == 200


async def test_media_over_the_budget_is_413(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], multimodal_max_inflight_bytes=1000)
    refused = await gateway.post("/v1/chat/completions", json=_image_chat(4000))
    assert refused.status_code == 413
    assert refused.headers["x-gw-error-code"] == "multimodal_payload_too_large"
    accepted = await gateway.post("/v1/chat/completions", json=_image_chat(400))
    assert accepted.status_code == 200
    assert data_plane().media is not None and data_plane().media.in_use == 0


async def test_media_budget_that_stays_full_gives_429(make_gateway, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], multimodal_max_inflight_bytes=1000)
    data_plane().media.wait_secs = 0.05  # type: ignore[union-attr]
    slow = asyncio.create_task(gateway.post("/v1/chat/completions", json={**_image_chat(1200), "mock": SLOW["mock"]}))
    media = data_plane().media
    assert media is not None
    for _ in range(500):  # until the slow request holds the budget (a fixed sleep raced a loaded machine)
        if media.in_use:
            break
        await asyncio.sleep(0.01)
    assert media.in_use
    refused = await gateway.post("/v1/chat/completions", json=_image_chat(400))
    assert refused.status_code == 429
    assert refused.headers["x-gw-error-code"] == "multimodal_inflight_budget"
    assert (await slow).status_code == 200
    text_only = await gateway.post("/v1/chat/completions", json=CHAT)
    assert text_only.status_code == 200
    assert data_plane().media.in_use == 0  # type: ignore[union-attr]


async def test_permits_return_to_zero_after_thousands_of_requests_with_disconnects(
    make_gateway, worker: RunningWorker
) -> None:
    gateway = make_gateway(
        [record_for(worker)], max_concurrent_requests=16, queue_size=3000, multimodal_max_inflight_bytes=10_000
    )
    rng = random.Random(1234)
    client_slots = asyncio.Semaphore(100)
    outcomes = {"cancelled": 0, "done": 0}
    statuses: set[int] = set()

    async def one(index: int) -> None:
        body: dict = {**CHAT, "stream": index % 3 == 0, "mock": {"tokens": rng.randint(1, 6), "delay_ms": rng.choice([0, 1, 2])}}
        if index % 5 == 0:
            body = {**_image_chat(400), "stream": body["stream"], "mock": body["mock"]}
        async with client_slots:
            call = asyncio.create_task(gateway.post("/v1/chat/completions", json=body))
            if rng.random() < 0.35:
                await asyncio.sleep(rng.uniform(0, 0.02))
                call.cancel()
            try:
                response: httpx.Response = await call
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
                return
            statuses.add(response.status_code)
            outcomes["done"] += 1

    await asyncio.gather(*(one(i) for i in range(2000)))
    await asyncio.sleep(0.05)
    rt = data_plane()
    assert rt.permits is not None and rt.media is not None
    assert rt.permits.in_flight == 0
    assert rt.permits.queued == 0
    assert rt.media.in_use == 0 and rt.media.queued == 0
    assert all(handle.load.in_flight == 0 for handle in rt.registry.snapshot.workers)
    assert outcomes["cancelled"] > 100 and outcomes["done"] > 100
    assert statuses <= {200, 429}


async def test_disconnect_while_queued_leaves_the_queue(make_gateway, worker: RunningWorker) -> None:
    """Server semantics: the app is not cancelled, ``receive`` reports ``http.disconnect``."""
    from gateway_project.asgi import application

    gateway = make_gateway([record_for(worker)], max_concurrent_requests=1, queue_size=5)
    slow = asyncio.create_task(gateway.post("/v1/chat/completions", json=SLOW))
    await asyncio.sleep(0.1)
    body = httpx.Request("POST", "http://gateway", json=CHAT).content
    left = asyncio.Event()
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    queued = asyncio.create_task(application(post_scope("/v1/chat/completions"), receive, send))
    await asyncio.sleep(0.05)
    pool = data_plane().permits
    assert pool is not None and pool.queued == 1
    left.set()
    await asyncio.wait_for(queued, 2)
    assert pool.queued == 0 and sent == []
    assert (await slow).status_code == 200
    assert pool.in_flight == 0
