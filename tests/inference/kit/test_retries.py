"""Retries on another worker and circuit breakers, against real mock workers told to fail."""

from __future__ import annotations

import orjson
import pytest

from inference.routing.breaker import BreakerState, Resilience
from inference.routing.registry import REGISTRY
from tests.conftest import GatewayFactory, WorkerFactory, record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
FAST_RETRY = {"retry_initial_backoff_ms": 1, "retry_max_backoff_ms": 5}


def handle(worker):
    return next(h for h in REGISTRY.snapshot.workers if h.url == worker.url)


async def test_500_is_retried_on_another_worker(make_gateway, start_worker) -> None:
    failing, healthy = await start_worker(), await start_worker()
    failing.state.fault_status = 500
    client = make_gateway([record_for(failing), record_for(healthy)], policy="round_robin", **FAST_RETRY)
    for _ in range(4):
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
    assert len(healthy.requests()) == 4
    assert handle(failing).load.breaker.failures == 2  # every other request started on it


async def test_unreachable_worker_is_retried_elsewhere(make_gateway, worker) -> None:
    client = make_gateway([record_for("http://127.0.0.1:9", model="mock-model"), record_for(worker)], **FAST_RETRY)
    for _ in range(3):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_when_every_worker_fails_the_last_answer_comes_back(make_gateway, start_worker) -> None:
    first, second = await start_worker(), await start_worker()
    first.state.fault_status = second.state.fault_status = 503
    client = make_gateway([record_for(first), record_for(second)], **FAST_RETRY)
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert "x-gw-error-code" not in response.headers  # the worker's answer, not the gateway's
    assert len(first.requests()) + len(second.requests()) == 2  # each worker tried once


async def test_client_errors_are_not_retried(make_gateway, start_worker) -> None:
    first, second = await start_worker(), await start_worker()
    client = make_gateway([record_for(first), record_for(second)], **FAST_RETRY)
    response = await client.post("/v1/chat/completions", json={**CHAT, "mock": {"status": 400}})
    assert response.status_code == 400
    assert len(first.requests()) + len(second.requests()) == 1
    assert all(h.load.breaker.failures == 0 for h in REGISTRY.snapshot.workers)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_flood_of_worker_4xx_leaves_the_breaker_closed(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, stream: bool
) -> None:
    """A worker's 4xx is the client's error (issue 22): relayed unchanged, never retried, never counted
    against the worker, however many come: past the failure threshold the worker still serves."""
    first, second = await start_worker(), await start_worker()
    client = make_gateway([record_for(first), record_for(second)], cb_failure_threshold=2, **FAST_RETRY)
    for status in (400, 404, 413, 422) * 3:
        body = {**CHAT, "stream": stream, "mock": {"status": status}}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == status and "x-gw-error-code" not in response.headers  # the worker's own
    assert len(first.requests()) + len(second.requests()) == 12  # each tried once
    assert all(h.load.breaker.state is BreakerState.CLOSED and h.load.breaker.failures == 0 for h in REGISTRY.snapshot.workers)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_disabled_retries_relay_the_failure(make_gateway, start_worker) -> None:
    failing, healthy = await start_worker(), await start_worker()
    failing.state.fault_status = 500
    client = make_gateway([record_for(failing), record_for(healthy)], disable_retries=True, policy="round_robin")
    statuses = sorted([(await client.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(2)])
    assert statuses == [200, 500]


async def test_body_over_the_replay_limit_is_not_retried(make_gateway, start_worker) -> None:
    failing, healthy = await start_worker(), await start_worker()
    failing.state.fault_status = 500
    client = make_gateway(
        [record_for(failing), record_for(healthy)], max_buffered_request_bytes=10, policy="round_robin", **FAST_RETRY
    )
    statuses = sorted([(await client.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(2)])
    assert statuses == [200, 500]


async def test_capacity_answers_are_retried_but_not_counted(make_gateway, start_worker) -> None:
    busy, healthy = await start_worker(), await start_worker()
    busy.state.fault_status = 429
    client = make_gateway([record_for(busy), record_for(healthy)], policy="round_robin", **FAST_RETRY)
    for _ in range(4):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert handle(busy).load.breaker.failures == 0


async def test_worker_dying_before_answering_is_retried(make_gateway, start_worker) -> None:
    dying, healthy = await start_worker(), await start_worker()
    dying.state.fault_drop = True  # closes every connection without an answer
    client = make_gateway([record_for(dying), record_for(healthy)], policy="round_robin", **FAST_RETRY)
    for _ in range(2):
        response = await client.post("/v1/chat/completions", json=CHAT)
        if response.status_code != 200:
            pytest.fail(f"lost a retryable request: {response.status_code} {response.text}")


async def test_stream_broken_after_it_started_is_not_retried(make_gateway, start_worker) -> None:
    first, second = await start_worker(), await start_worker()
    client = make_gateway([record_for(first), record_for(second)], **FAST_RETRY)
    body = {**CHAT, "stream": True, "mock": {"fail_after": 2, "tokens": 10}}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]" and "error" in orjson.loads(lines[-2][6:])
    assert len(first.requests()) + len(second.requests()) == 1


async def test_open_breaker_takes_the_worker_out_until_half_open(make_gateway, start_worker) -> None:
    failing, healthy = await start_worker(), await start_worker()
    failing.state.fault_status = 500
    client = make_gateway(
        [record_for(failing), record_for(healthy)], policy="round_robin", cb_failure_threshold=2, **FAST_RETRY
    )
    for _ in range(4):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    breaker = handle(failing).load.breaker
    assert breaker.state is BreakerState.OPEN
    sent_before = len(failing.requests())
    for _ in range(4):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert len(failing.requests()) == sent_before  # not selected while open
    failing.state.fault_status = None
    breaker.config = Resilience(failure_threshold=2, success_threshold=1, timeout_secs=0)
    for _ in range(4):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert breaker.state is BreakerState.CLOSED and len(failing.requests()) > sent_before


async def test_every_breaker_open_is_503(make_gateway, worker) -> None:
    client = make_gateway([record_for(worker)], cb_failure_threshold=1, disable_retries=True)
    worker.state.fault_status = 500
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 500
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_healthy_workers"
