"""PD admission: a prefill/decode pair whose side the load monitor found overloaded (its overload
thresholds, read from the stand-ins' real /get_load by the real load monitor) makes the request wait
up to --pd-admission-wait-secs for a report that frees it, else sheds it with 503
worker_overload_protection_shed and Retry-After (not retried). Waiting requests hold no worker slot."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import httpx
import pytest

from administration.loads import LoadMonitor, LoadTarget
from common.config import ConfigError, parse_gateway_args
from common.telemetry import REGISTRY as METRICS
from inference.routing.registry import REGISTRY
from tests.conftest import GatewayFactory
from tests.pd_fleet import PdWorker, serving_pd_worker

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BUSY = [{"num_waiting_reqs": 8}]
CALM = [{"num_waiting_reqs": 0}]


def counter(name: str, **labels: str) -> float:
    return METRICS.get_sample_value(name, labels or None) or 0.0


def counts() -> tuple[float, float, float]:
    return (
        counter("gw_pd_admission_waits_total"),
        counter("gw_pd_admission_sheds_total"),
        counter("gw_worker_overload_shed_total", stage="pd_admission"),
    )


@contextlib.asynccontextmanager
async def pd_fleet(
    make_gateway: GatewayFactory, **config: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, PdWorker, PdWorker, LoadMonitor]]:
    """A prefill and a decode stand-in behind a gateway, polled by the load monitor with an overload
    threshold of 4 waiting requests on both."""
    monitor = LoadMonitor(interval=7.0)
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        gateway = make_gateway(
            [prefill.record(), decode.record()], retry_max_retries=0, load_monitor_interval=7.0, **config
        )
        monitor.reconcile([
            LoadTarget(handle.id, handle.url, None, handle.record.worker_type, "sglang", waiting_requests=4)
            for handle in REGISTRY.snapshot.workers
        ])  # fmt: skip
        try:
            yield gateway, prefill, decode, monitor
        finally:
            await monitor.aclose()
            REGISTRY.loads_polled_at = None


def generations(worker: PdWorker) -> int:
    return len(worker.pd.received)


async def test_an_overloaded_decode_makes_the_request_wait_for_the_report_that_frees_it(
    make_gateway: GatewayFactory,
) -> None:
    async with pd_fleet(make_gateway, pd_admission_wait_secs=60.0) as (gateway, prefill, decode, monitor):
        decode.mock.engine_loads = BUSY
        await monitor.apoll()
        before = counts()
        waiting = asyncio.ensure_future(gateway.post("/v1/chat/completions", json=CHAT))
        await asyncio.sleep(0.3)  # the request is admitted only by a load report, not by time
        assert not waiting.done()
        assert (generations(prefill), generations(decode)) == (0, 0)  # nothing sent to either side
        for handle in REGISTRY.snapshot.workers:
            assert handle.load.in_flight == 0  # the waiting request holds no worker slot

        decode.mock.engine_loads = CALM
        await monitor.apoll()
        answer = await waiting
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        assert (generations(prefill), generations(decode)) == (1, 1)
        assert counts() == (before[0] + 1, before[1], before[2])


async def test_an_overloaded_prefill_is_waited_for_too(make_gateway: GatewayFactory) -> None:
    async with pd_fleet(make_gateway, pd_admission_wait_secs=60.0) as (gateway, prefill, decode, monitor):
        prefill.mock.engine_loads = BUSY
        await monitor.apoll()
        before = counts()
        waiting = asyncio.ensure_future(gateway.post("/v1/chat/completions", json=CHAT))
        await asyncio.sleep(0.3)
        assert not waiting.done() and generations(decode) == 0
        prefill.mock.engine_loads = CALM
        await monitor.apoll()
        assert (await waiting).status_code == 200
        assert counts()[0] == before[0] + 1


async def test_no_report_in_time_sheds_with_retry_after_and_no_retry(make_gateway: GatewayFactory) -> None:
    async with pd_fleet(make_gateway, pd_admission_wait_secs=0.2) as (gateway, prefill, decode, monitor):
        decode.mock.engine_loads = BUSY
        await monitor.apoll()
        before = counts()
        shed = await gateway.post("/v1/chat/completions", json=CHAT)
        assert shed.status_code == 503
        assert shed.headers["retry-after"] == "7"  # the load-monitor interval
        assert shed.headers["x-gw-error-code"] == "worker_overload_protection_shed"
        assert shed.json()["error"]["code"] == "worker_overload_protection_shed"
        assert (generations(prefill), generations(decode)) == (0, 0)  # not tried on any worker
        assert counts() == (before[0], before[1] + 1, before[2] + 1)

        decode.mock.engine_loads = CALM
        await monitor.apoll()
        assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert counts()[:2] == (before[0], before[1] + 1)  # admitted at once: no wait counted


async def test_a_wait_of_zero_sheds_at_once_and_selection_sheds_are_not_counted(make_gateway: GatewayFactory) -> None:
    async with pd_fleet(make_gateway, pd_admission_wait_secs=0.0) as (gateway, prefill, decode, monitor):
        prefill.mock.engine_loads = decode.mock.engine_loads = BUSY
        await monitor.apoll()
        before, selection = counts(), counter("gw_worker_overload_shed_total", stage="selection")
        shed = await gateway.post("/v1/chat/completions", json=CHAT)
        assert shed.status_code == 503 and shed.json()["error"]["code"] == "worker_overload_protection_shed"
        assert counts() == (before[0], before[1] + 1, before[2] + 1)
        assert counter("gw_worker_overload_shed_total", stage="selection") == selection


async def test_a_request_that_cannot_pair_is_not_held_by_admission(make_gateway: GatewayFactory) -> None:
    """Only overload waits: no decode worker at all is answered at once, as before."""
    async with serving_pd_worker("prefill") as prefill:
        gateway = make_gateway([prefill.record()], pd_admission_wait_secs=60.0)
        before = counts()
        answer = await gateway.post("/v1/chat/completions", json=CHAT)
        assert answer.status_code == 503 and answer.json()["error"]["code"] != "worker_overload_protection_shed"
        assert counts() == before


def test_the_wait_is_a_flag_with_a_default() -> None:
    assert parse_gateway_args([]).pd_admission_wait_secs == 30.0
    assert parse_gateway_args(["--pd-admission-wait-secs", "0"]).pd_admission_wait_secs == 0.0
    with pytest.raises(ConfigError):
        parse_gateway_args(["--pd-admission-wait-secs", "-1"])
