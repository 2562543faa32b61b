"""Routing policies seen from a client: the in-process gateway in front of real mock workers."""

from __future__ import annotations

from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, record_for

SYSTEM = "You are the support assistant of a bicycle shop. Answer politely and briefly. " * 20


def chat(question: str) -> dict:
    return {
        "model": "mock-model",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 4,
    }


def served(workers: list[RunningWorker]) -> list[int]:
    return [len([r for r in worker.requests() if r["path"] == "/v1/chat/completions"]) for worker in workers]


async def test_same_routing_key_lands_on_one_worker(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    workers = [await start_worker() for _ in range(3)]
    gateway = make_gateway([record_for(worker) for worker in workers], policy="consistent_hashing")
    for i in range(8):
        response = await gateway.post("/v1/chat/completions", json=chat(f"q{i}"), headers={"x-gw-routing-key": "user-7"})
        assert response.status_code == 200, response.text
    assert sorted(served(workers)) == [0, 0, 8]
    for i in range(30):
        await gateway.post("/v1/chat/completions", json=chat("x"), headers={"x-gw-routing-key": f"user-{i}"})
    assert sum(1 for count in served(workers) if count) >= 2  # other keys spread over the fleet


async def test_cache_aware_sends_a_shared_prefix_to_the_same_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    workers = [await start_worker() for _ in range(3)]
    gateway = make_gateway([record_for(worker) for worker in workers], policy="cache_aware")
    first = await gateway.post("/v1/chat/completions", json=chat("Do you sell tandem bikes?"))
    second = await gateway.post("/v1/chat/completions", json=chat("What are your opening hours?"))
    assert first.status_code == second.status_code == 200
    assert sorted(served(workers)) == [0, 0, 2]
    other = {"model": "mock-model", "prompt": "An unrelated completion prompt", "max_tokens": 4}
    assert (await gateway.post("/v1/completions", json=other)).status_code == 200
    busy = served(workers).index(2)
    assert [len(worker.requests()) for index, worker in enumerate(workers) if index != busy] in ([1, 0], [0, 1])


async def test_model_policy_applies_per_model(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    workers = [await start_worker() for _ in range(2)]
    gateway = make_gateway(
        [record_for(worker) for worker in workers], policy="round_robin", model_policies=(("mock-model", "cache_aware"),)
    )
    for question in ("one", "two", "three", "four"):
        assert (await gateway.post("/v1/chat/completions", json=chat(question))).status_code == 200
    assert sorted(served(workers)) == [0, 4]  # round robin would have alternated
