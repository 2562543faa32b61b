"""Workers failing under real traffic: a worker killed mid-traffic loses no request that could still
be retried, and one that fails its health checks leaves and rejoins routing."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.e2e.conftest import free_port

pytestmark = pytest.mark.e2e

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


def _mock(spawn, name: str, delay_ms: int = 0):
    port = free_port()
    return spawn(
        name,
        ["runmockworker", "--host", "127.0.0.1", "--port", str(port), "--model", "mock-model", "--tokens", "8",
         "--delay-ms", str(delay_ms)],
        port,
    )


def _wait_for_ready_workers(gateway, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(gateway.url + "/readiness").json()["workers"]["ready"] == count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{count} workers not ready within {timeout}s")


def test_worker_killed_mid_traffic_loses_no_retryable_request(spawn, start_gateway) -> None:
    doomed, survivor = _mock(spawn, "doomed", delay_ms=25), _mock(spawn, "survivor", delay_ms=25)
    gateway = start_gateway("--worker-urls", doomed.url, survivor.url, "--retry-initial-backoff-ms", "5")
    _wait_for_ready_workers(gateway, 2)  # /readiness is 200 with one; traffic needs both

    async def traffic() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:

            async def one(i: int) -> int:
                await asyncio.sleep(i * 0.01)
                return (await client.post(gateway.url + "/v1/chat/completions", json=CHAT)).status_code

            async def kill() -> None:
                await asyncio.sleep(0.3)
                try:
                    await client.post(doomed.url + "/_mock/exit")
                except httpx.HTTPError:
                    pass

            results = await asyncio.gather(*(one(i) for i in range(120)), kill())
            return [status for status in results if status is not None]

    statuses = asyncio.run(traffic())
    assert doomed.popen.wait(timeout=5) == 1  # it really died mid-traffic
    assert statuses == [200] * 120
    served = httpx.get(survivor.url + "/_mock/stats").json()["requests"]
    assert served > 60  # the survivor took over the doomed worker's share


def test_unhealthy_worker_leaves_routing_and_returns(spawn, start_gateway) -> None:
    sick, steady = _mock(spawn, "sick"), _mock(spawn, "steady")
    gateway = start_gateway(
        "--worker-urls", sick.url, steady.url,
        "--health-check-interval-secs", "0.3", "--health-failure-threshold", "2", "--health-success-threshold", "1",
    )
    _wait_for_ready_workers(gateway, 2)
    httpx.post(sick.url + "/_mock/faults", json={"health_status": 503})

    def routable_count() -> int:
        return httpx.get(gateway.url + "/readiness").json()["workers"]["ready"]

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and routable_count() != 1:
        time.sleep(0.2)
    assert routable_count() == 1
    httpx.delete(sick.url + "/_mock/requests")
    for _ in range(6):
        assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert httpx.get(sick.url + "/_mock/requests", params={"path": "/v1/chat/completions"}).json() == []
    httpx.delete(sick.url + "/_mock/faults")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and routable_count() != 2:
        time.sleep(0.2)
    assert routable_count() == 2
