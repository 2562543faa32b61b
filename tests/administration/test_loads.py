"""The load monitor, /loads and worker overload protection, against real mock workers."""

from __future__ import annotations

import dataclasses
from typing import AsyncIterator

import pytest

from administration.loads import LoadMonitor, LoadTarget, entries_from_get_load
from inference.routing.registry import REGISTRY
from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, record_for


@pytest.fixture
async def monitor() -> AsyncIterator[LoadMonitor]:
    running = LoadMonitor(interval=7.0)
    yield running
    await running.aclose()
    REGISTRY.loads_polled_at = None


def targets(**thresholds: object) -> list[LoadTarget]:
    """One load target per worker in the published registry."""
    return [
        LoadTarget(
            worker_id=handle.id,
            url=handle.url,
            api_key=handle.record.api_key,
            worker_type=handle.record.worker_type,
            runtime_type=handle.record.runtime_type,
            **thresholds,  # type: ignore[arg-type]
        )
        for handle in REGISTRY.snapshot.workers
    ]


def chat() -> dict:
    return {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def chats(worker: RunningWorker) -> int:
    return len([r for r in worker.requests() if r["path"] == "/v1/chat/completions"])


async def test_loads_before_the_first_poll_is_empty(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    response = await make_gateway([record_for(worker)]).get("/loads")
    assert response.status_code == 200
    body = response.json()
    assert body["loads"] == [] and body["dp_rank_count"] == 0 and "aggregate" not in body
    assert body["version"].startswith("gateway-") and "T" in body["timestamp"]
    assert not [r for r in worker.requests() if r["path"] in ("/get_load", "/metrics")]  # cached only


async def test_loads_after_a_poll_report_every_dp_rank(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, monitor: LoadMonitor
) -> None:
    worker = await start_worker(api_key="sk-worker")
    worker.state.engine_loads = [
        {"num_running_reqs": 3, "num_waiting_reqs": 2, "num_used_tokens": 50_000, "gen_throughput": 40.0},
        {"num_running_reqs": 1, "num_waiting_reqs": 0, "num_used_tokens": 10_000, "gen_throughput": 20.0},
    ]
    gateway = make_gateway([record_for(worker, api_key="sk-worker")])
    monitor.reconcile(targets())
    await monitor.apoll()
    body = (await gateway.get("/loads")).json()
    assert body["dp_rank_count"] == 2
    first, second = body["loads"]
    assert first["worker"] == worker.url and first["worker_type"] == "regular" and first["dp_rank"] == 0
    assert (first["num_running_reqs"], first["num_waiting_reqs"], first["num_total_reqs"]) == (3, 2, 5)
    assert first["max_total_num_tokens"] == 100_000 and first["token_usage"] == pytest.approx(0.5)
    assert first["num_waiting_uncached_tokens"] == 0 and second["dp_rank"] == 1
    assert body["aggregate"] == {
        "total_running_reqs": 4,
        "total_waiting_reqs": 2,
        "total_reqs": 6,
        "avg_token_usage": pytest.approx(0.3),
        "avg_throughput": pytest.approx(30.0),
        "avg_utilization": pytest.approx((3 / 256 + 1 / 256) / 2),
    }
    polled = [r for r in worker.requests() if r["path"] == "/get_load"]
    assert polled and polled[-1]["headers"]["authorization"] == "Bearer sk-worker"
    assert (await gateway.get("/loads?model=other")).json()["loads"] == []
    assert len((await gateway.get("/loads?model=mock-model")).json()["loads"]) == 2


async def test_engines_without_get_load_are_read_from_metrics(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, monitor: LoadMonitor
) -> None:
    worker = await start_worker(owned_by="vllm")
    worker.state.engine_loads = [{"num_running_reqs": 4, "num_waiting_reqs": 6, "token_usage": 0.25}]
    gateway = make_gateway([record_for(worker)])
    monitor.reconcile([dataclasses.replace(t, runtime_type="vllm") for t in targets()])
    await monitor.apoll()
    (entry,) = (await gateway.get("/loads")).json()["loads"]
    assert (entry["num_running_reqs"], entry["num_waiting_reqs"], entry["token_usage"]) == (4, 6, 0.25)
    assert entry["max_total_num_tokens"] == 0


async def test_a_failed_poll_leaves_the_worker_out(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, monitor: LoadMonitor
) -> None:
    good, bad = await start_worker(), await start_worker()
    gateway = make_gateway([record_for(good), record_for(bad)])
    monitor.reconcile(targets())
    await monitor.apoll()
    assert len((await gateway.get("/loads")).json()["loads"]) == 2
    bad.state.load_status = bad.state.metrics_status = 500
    await monitor.apoll()
    assert [entry["worker"] for entry in (await gateway.get("/loads")).json()["loads"]] == [good.url]


def test_get_load_of_older_engines_counts_running_from_num_reqs() -> None:
    target = LoadTarget("w", "http://w", None, "decode", "sglang")
    (entry,) = entries_from_get_load(target, [{"dp_rank": 0, "num_reqs": 7, "num_waiting_reqs": 3, "num_tokens": 12}])
    assert (entry["num_running_reqs"], entry["num_waiting_reqs"], entry["num_used_tokens"]) == (4, 3, 12)
    assert entry["worker_type"] == "decode" and entry["token_usage"] == 0.0


async def test_an_overloaded_worker_leaves_routing_and_returns(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, monitor: LoadMonitor
) -> None:
    calm, busy = await start_worker(), await start_worker()
    gateway = make_gateway([record_for(calm), record_for(busy)], policy="round_robin", load_monitor_interval=7.0)
    monitor.reconcile(targets(waiting_requests=4))
    busy.state.engine_loads = [{"num_waiting_reqs": 2}, {"num_waiting_reqs": 2}]  # 4 summed over ranks
    await monitor.apoll()
    for _ in range(4):
        assert (await gateway.post("/v1/chat/completions", json=chat())).status_code == 200
    assert (chats(calm), chats(busy)) == (4, 0)

    busy.state.engine_loads = [{"num_waiting_reqs": 1}, {"num_waiting_reqs": 2}]
    await monitor.apoll()
    for _ in range(4):
        assert (await gateway.post("/v1/chat/completions", json=chat())).status_code == 200
    assert chats(busy) > 0


async def test_all_workers_overloaded_is_503_with_retry_after(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, monitor: LoadMonitor
) -> None:
    workers = [await start_worker(), await start_worker()]
    gateway = make_gateway([record_for(w) for w in workers], load_monitor_interval=7.0)
    monitor.reconcile(targets(token_usage=0.8))
    for worker in workers:
        worker.state.engine_loads = [{"token_usage": 0.9}, {"token_usage": 0.75}]  # mean 0.825
    await monitor.apoll()
    shed = await gateway.post("/v1/chat/completions", json=chat())
    assert shed.status_code == 503
    assert shed.headers["retry-after"] == "7"
    assert shed.headers["x-gw-error-code"] == "worker_overload_protection_shed"
    assert shed.json()["error"]["code"] == "worker_overload_protection_shed"
    assert sum(chats(w) for w in workers) == 0  # not tried on any worker

    workers[0].state.engine_loads = [{"token_usage": 0.5}]
    await monitor.apoll()
    assert (await gateway.post("/v1/chat/completions", json=chat())).status_code == 200
    assert chats(workers[0]) == 1


async def test_without_thresholds_a_busy_worker_stays_in_routing(
    make_gateway: GatewayFactory, worker: RunningWorker, monitor: LoadMonitor
) -> None:
    gateway = make_gateway([record_for(worker)])
    monitor.reconcile(targets())
    worker.state.engine_loads = [{"num_waiting_reqs": 500, "token_usage": 1.0}]
    await monitor.apoll()
    assert (await gateway.post("/v1/chat/completions", json=chat())).status_code == 200


@pytest.mark.django_db(transaction=True)
async def test_fleet_polls_registered_workers_and_applies_their_overload_block(start_worker: WorkerFactory) -> None:
    from django.test import AsyncClient

    from administration.registry_sync import RegistrySync
    from common.config import GatewayConfig, install_config
    from tests.administration.test_workers_api import FAST, register
    from tests.conftest import until

    config = dataclasses.replace(FAST, load_monitor_interval=0.1)
    install_config(config, export=False)
    fleet = RegistrySync(config)
    await fleet.astart()
    try:
        api = AsyncClient()
        worker = await start_worker()
        worker.state.engine_loads = [{"num_running_reqs": 2, "num_waiting_reqs": 5}]
        got = await register(api, {"url": worker.url, "overload": {"waiting_requests": 5}})

        async def overloaded() -> bool:
            load = REGISTRY.load_of(got["id"])
            return load is not None and load.overloaded

        await until(overloaded)
        shown = (await api.get(f"/workers/{got['id']}")).json()
        assert shown["overload"] == {"waiting_requests": 5}
        assert shown["engine_load"][0]["num_waiting_reqs"] == 5 and shown["engine_load"][0]["worker"] == worker.url

        worker.state.engine_loads = [{"num_waiting_reqs": 4}]

        async def recovered() -> bool:
            load = REGISTRY.load_of(got["id"])
            return load is not None and not load.overloaded

        await until(recovered)
    finally:
        await fleet.astop()
        REGISTRY.publish([], {})
        REGISTRY.loads_polled_at = None
        install_config(GatewayConfig(), export=False)


async def test_mock_load_and_fault_switches_over_http(worker: RunningWorker) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=worker.url) as client:
        ranks = (await client.post("/_mock/load", json={"ranks": [{"num_waiting_reqs": 3}, {}]})).json()
        assert [r["num_waiting_reqs"] for r in ranks] == [3, 0] and ranks[1]["dp_rank"] == 1
        assert (await client.get("/get_load")).json()[0]["num_reqs"] == 3
        faults = (await client.post("/_mock/faults", json={"load_status": 500, "flush_status": 502})).json()
        assert (faults["load_status"], faults["flush_status"]) == (500, 502)
        assert (await client.get("/get_load")).status_code == 500
        assert (await client.post("/flush_cache")).status_code == 502
        await client.delete("/_mock/faults")
        assert (await client.get("/get_load")).status_code == 200
        assert 'sglang:num_queue_reqs{model_name="mock-model",dp_rank="0"} 3.0' in (await client.get("/metrics")).text


async def test_polls_ask_the_route_that_answered_and_leave_workers_without_one_alone(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, monitor: LoadMonitor
) -> None:
    """A worker that reports through /metrics only is asked there from then on (one request a poll);
    one with neither route (a plain OpenAI server) is not asked again for a minute."""
    metrics_only, plain = await start_worker(), await start_worker()
    metrics_only.state.load_status = 404
    plain.state.load_status = plain.state.metrics_status = 404
    make_gateway([record_for(metrics_only), record_for(plain)])
    monitor.reconcile(targets())
    for _ in range(3):
        await monitor.apoll()

    def asked(worker) -> dict[str, int]:
        return {path: count for path, count in worker.state.stats()["requests_by_path"].items()
                if path in ("/get_load", "/metrics")}

    assert asked(metrics_only) == {"/get_load": 1, "/metrics": 3}
    assert asked(plain) == {"/get_load": 1, "/metrics": 1}
