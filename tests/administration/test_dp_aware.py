"""--dp-aware through the whole ASGI application and its real fleet loop: registration stores the
engine's reported dp_size (HTTP: SGLang's /server_info; gRPC: GetServerInfo, SGLang's
server_args.dp_size and vLLM's data_parallel_size), each request is sent to one data-parallel rank
(HTTP: the JSON body's data_parallel_rank; gRPC: GenerateRequest.data_parallel_rank), the ranks used
in turn across requests, each side of an HTTP or PUT /workers/{id} refused 400;
gRPC PD pair too; and the flag off changes nothing."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, AsyncIterator

import httpx
import pytest

from administration.registry_sync import RegistrySync
from common.config import current_config
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerRecord, WorkerStatus, WorkerType
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd import GrpcPdServer
from standins.pd_worker import PdWorkerConfig
from tests.administration.test_grpc_workers import EngineFactory, handle_of, register, start_engine  # noqa: F401
from tests.conftest import GatewayFactory, WorkerFactory, until
from tests.inference.served.conftest import QWEN, QWEN_MODEL
from tests.inference.served.test_pd_served import pd_record
from tests.pd_fleet import serving_pd_worker

pytestmark = pytest.mark.django_db(transaction=True)

FAST: dict[str, Any] = dict(
    worker_startup_check_interval=0.2,
    worker_startup_timeout_secs=5.0,
    health_check_interval_secs=0.2,
    health_success_threshold=1,
    health_failure_threshold=2,
    drain_settle_secs=0.0,
)
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(params=[True, False], ids=["dp_aware", "flag_off"])
def dp_aware(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def gateway(make_gateway: GatewayFactory, dp_aware: bool) -> httpx.AsyncClient:
    return make_gateway([], dp_aware=dp_aware, **FAST)


@pytest.fixture
async def fleet(gateway: httpx.AsyncClient) -> AsyncIterator[RegistrySync]:
    running = RegistrySync(current_config())
    await running.astart()
    yield running
    await running.astop()


async def test_http_requests_take_the_ranks_in_turn(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_worker: WorkerFactory, dp_aware: bool
) -> None:
    worker = await start_worker(dp_size=2)
    got = await register(gateway, {"url": worker.url})
    for _ in range(3):
        assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
    streamed = await gateway.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert (await gateway.post("/generate", json={"model": "mock-model", "text": "hi"})).status_code == 200
    sent = [r["json"] for r in worker.requests() if r["method"] == "POST"]
    handle = handle_of(got["id"])
    assert handle is not None
    if dp_aware:
        assert got["labels"]["dp_size"] == "2" and handle.record.dp_ranks == 2
        assert [body["data_parallel_rank"] for body in sent] == [0, 1, 0, 1, 0]
        assert handle.load.rank_in_flight == [0, 0]  # every rank given back
    else:  # the flag off: nothing asked, nothing stored, nothing sent
        assert "dp_size" not in got["labels"] and handle.record.dp_ranks == 0
        assert all("data_parallel_rank" not in body for body in sent)
        assert not any(r["path"] in ("/server_info", "/get_server_info") for r in worker.requests())


async def test_the_gateways_rank_replaces_a_clients(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_worker: WorkerFactory, dp_aware: bool
) -> None:
    worker = await start_worker(dp_size=4)
    await register(gateway, {"url": worker.url})
    response = await gateway.post("/v1/chat/completions", json={**CHAT, "data_parallel_rank": 3})
    assert response.status_code == 200
    assert worker.requests()[-1]["json"]["data_parallel_rank"] == (0 if dp_aware else 3)


async def test_an_engine_reporting_no_dp_size_is_routed_without_a_rank(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_worker: WorkerFactory
) -> None:
    worker = await start_worker(owned_by="vllm")  # no /server_info
    got = await register(gateway, {"url": worker.url})
    assert "dp_size" not in got["labels"]
    assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert "data_parallel_rank" not in worker.requests()[-1]["json"]


async def test_an_operators_dp_size_label_gives_the_ranks(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_worker: WorkerFactory, dp_aware: bool
) -> None:
    worker = await start_worker(owned_by="vllm")  # a vLLM HTTP server reports no dp_size: the operator tells
    await register(gateway, {"url": worker.url, "labels": {"dp_size": "2"}})
    for _ in range(2):
        assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
    ranks = [r["json"].get("data_parallel_rank") for r in worker.requests() if r["method"] == "POST"]
    assert ranks == ([0, 1] if dp_aware else [None, None])


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
async def test_grpc_requests_carry_the_rank(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory, dp_aware: bool, runtime: str
) -> None:
    engine = await start_engine(runtime, dp_size=2)
    got = await register(gateway, {"url": engine.url})

    async def tokenizer_loaded() -> bool:  # ready workers serve once their tokenizer is in (readiness says so)
        return (await gateway.get("/readiness")).status_code == 200

    await until(tokenizer_loaded)
    for stream in (False, True, False):
        response = await gateway.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert response.status_code == 200, response.text
    assert (await gateway.post("/v1/completions", json={"model": "mock-model", "prompt": "hi", "max_tokens": 2})).status_code == 200
    ranks = [served.data_parallel_rank for served in engine.state.requests]
    if dp_aware:
        assert got["labels"]["dp_size"] == "2"
        assert ranks == [0, 1, 0, 1]
    else:
        assert "dp_size" not in got["labels"] and ranks == [None] * 4


async def test_put_is_refused_under_dp_aware(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_worker: WorkerFactory, dp_aware: bool
) -> None:
    worker = await start_worker()
    got = await register(gateway, {"url": worker.url})
    response = await gateway.put(f"/workers/{got['id']}", json={"url": worker.url})
    if dp_aware:
        assert response.status_code == 400
        body = response.json()
        assert body["code"] == "BAD_REQUEST" and "PUT is not supported for data-parallel workers" in body["error"]
        assert "job_status" not in (await gateway.get(f"/workers/{got['id']}")).json()  # nothing queued
    else:
        assert response.status_code == 202
    # PATCH stays allowed.
    patched = await gateway.patch(f"/workers/{got['id']}", json={"priority": 3})
    assert patched.status_code == 202


def _ranked(record: WorkerRecord, ranks: int) -> WorkerRecord:
    return dataclasses.replace(record, dp_ranks=ranks)


async def test_each_side_of_an_http_pd_pair_takes_its_own_rank(make_gateway: GatewayFactory) -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        records = [_ranked(prefill.record(), 2), _ranked(decode.record(), 3)]
        gateway = make_gateway(records, retry_max_retries=0, dp_aware=True)
        for _ in range(3):
            response = await gateway.post("/v1/chat/completions", json=CHAT)
            assert response.status_code == 200, response.text
        prefill_ranks = [r["json"]["data_parallel_rank"] for r in prefill.mock.requests if r["method"] == "POST"]
        decode_ranks = [r["json"]["data_parallel_rank"] for r in decode.mock.requests if r["method"] == "POST"]
        assert prefill_ranks == [0, 1, 0] and decode_ranks == [0, 1, 2]
        # Both sides got the same bootstrap, each its own rank.
        assert prefill.pd.received[-1] == decode.pd.received[-1]


async def test_a_worker_without_ranks_beside_one_with_ranks(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    ranked, plain = await start_worker(), await start_worker()
    records = [
        WorkerRecord(str(uuid.uuid4()), ranked.url, "mock-model", "sglang", WorkerStatus.READY, dp_ranks=2),
        WorkerRecord(str(uuid.uuid4()), plain.url, "mock-model", "sglang", WorkerStatus.READY),
    ]
    gateway = make_gateway(records, dp_aware=True)
    for _ in range(4):
        assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert [r["json"]["data_parallel_rank"] for r in ranked.requests()] == [0, 1]
    assert all("data_parallel_rank" not in r["json"] for r in plain.requests())


async def test_each_side_of_a_grpc_pd_pair_takes_its_own_rank(make_gateway: GatewayFactory) -> None:
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("decode"))
    await prefill.start()
    await decode.start()
    try:
        records = [
            _ranked(pd_record(prefill, WorkerType.PREFILL), 3), _ranked(pd_record(decode, WorkerType.DECODE), 2),
        ]
        TOKENIZERS.cache.get(QWEN, None)  # loaded up front
        gateway = make_gateway(records, retry_max_retries=0, dp_aware=True)
        chat = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        for stream in (False, True, False, False):
            response = await gateway.post("/v1/chat/completions", json={**chat, "stream": stream})
            assert response.status_code == 200, response.text
        assert [served.data_parallel_rank for served in prefill.state.requests] == [0, 1, 2, 0]
        assert [served.data_parallel_rank for served in decode.state.requests] == [0, 1, 0, 1]
        assert prefill.pd.received[-1] == decode.pd.received[-1]  # one rendezvous, two ranks
        for server in (prefill, decode):
            (handle,) = [h for h in REGISTRY.snapshot.workers if h.url == server.url]
            assert handle.load.rank_in_flight == [0] * handle.record.dp_ranks  # every rank given back
    finally:
        await prefill.stop()
        await decode.stop()
