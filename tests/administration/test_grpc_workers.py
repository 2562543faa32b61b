"""The control plane of gRPC workers, against real gRPC engine stand-ins on loopback and the whole
ASGI application with its real fleet loop: registration (runtime detection by HealthCheck, the
engine's GetModelInfo as labels, retries while unreachable), the parser-name check at the request
(before any registration), health checks by HealthCheck, load polls by GetLoads, the /flush_cache and profiling
fan-outs, the 501 of the worker-information routes in gRPC-only fleets, and the engine client's
channel closed when its worker leaves."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import pytest

from administration import registration
from administration.api import fanout
from administration.jobs import wait_for_local_jobs
from administration.loads import NO_LOAD_ROUTE_RETRY_SECS
from administration.registry_sync import RegistrySync
from common.config import current_config, install_config
from inference.dataplane import data_plane
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerHandle
from inference.upstreams.engine import EngineClient
from inference.upstreams.grpc import detect
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer
from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, free_port, record_for, until
from standins.fixtures import FIXTURE_MODELS

pytestmark = pytest.mark.django_db(transaction=True)

MISTRAL = FIXTURE_MODELS / "mistral"  # the smallest
FAST: dict[str, Any] = dict(
    worker_startup_check_interval=0.2,
    worker_startup_timeout_secs=5.0,
    health_check_interval_secs=0.2,
    health_success_threshold=1,
    health_failure_threshold=2,
    drain_settle_secs=0.0,
)

EngineFactory = Callable[..., Awaitable[GrpcEngineServer]]


@pytest.fixture
async def start_engine() -> AsyncIterator[EngineFactory]:
    """Start gRPC engine stand-ins on 127.0.0.1 inside the test's event loop."""
    servers: list[GrpcEngineServer] = []

    async def start(runtime: str = "sglang", port: int = 0, **options: Any) -> GrpcEngineServer:
        server = GrpcEngineServer(GrpcEngineConfig(runtime=runtime, tokenizer=str(MISTRAL), **options))
        await server.start(port=port)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop(None)


@pytest.fixture
def gateway(make_gateway: GatewayFactory) -> httpx.AsyncClient:
    """The whole ASGI application in-process (its registry published by the fleet loop)."""
    return make_gateway([], **FAST)


@pytest.fixture
async def fleet(gateway: httpx.AsyncClient) -> AsyncIterator[RegistrySync]:
    """The gateway's real control plane: registration jobs on job threads, the fleet loop (health
    checks, load monitor) on this test's loop, which is then the serving loop."""
    running = RegistrySync(current_config())
    await running.astart()
    yield running
    await running.astop()
    # A registration job still probing a gRPC worker (retrying until its startup timeout) would go on
    # dialling that worker's port after the test, into whatever a later test binds there.
    await asyncio.to_thread(wait_for_local_jobs, 15.0)


async def status_of(gateway: httpx.AsyncClient, worker_id: str) -> str | None:
    got = await gateway.get(f"/workers/{worker_id}")
    return got.json()["status"] if got.status_code == 200 and "job_status" not in got.json() else None


async def register(gateway: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """POST the worker and wait until it is ready (and the registry snapshot routes it)."""
    response = await gateway.post("/workers", json=body)
    assert response.status_code == 202, response.text
    worker_id = response.json()["worker_id"]

    async def ready() -> bool:
        return await status_of(gateway, worker_id) == "ready" and handle_of(worker_id) is not None

    await until(ready)
    return (await gateway.get(f"/workers/{worker_id}")).json()  # type: ignore[no-any-return]


async def released(gateway: httpx.AsyncClient, body: dict[str, Any]) -> None:
    """POST the worker and wait until its registration fails (the reserved id answers 404)."""
    response = await gateway.post("/workers", json=body)
    assert response.status_code == 202, response.text
    location = response.json()["location"]

    async def gone() -> bool:
        return (await gateway.get(location)).status_code == 404

    await until(gone)


def handle_of(worker_id: str) -> WorkerHandle | None:
    """The worker in the registry snapshot, once it is there as ready."""
    for handle in REGISTRY.snapshot.workers:
        if handle.id == worker_id and handle.record.status == "ready":
            return handle
    return None


def connect_spy(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[Any]:
    """Count the short-lived clients ``module`` opens with ``connect_engine`` (an entry per attempt:
    the client, or the exception)."""
    made: list[Any] = []
    real = module.connect_engine

    async def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            client = await real(*args, **kwargs)
        except Exception as exc:
            made.append(exc)
            raise
        made.append(client)
        return client

    monkeypatch.setattr(module, "connect_engine", spy)
    return made


# --- registration ------------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
async def test_registration_detects_the_runtime_and_labels_the_engines_model_facts(
    gateway: httpx.AsyncClient,
    fleet: RegistrySync,
    start_engine: EngineFactory,
    monkeypatch: pytest.MonkeyPatch,
    runtime: str,
) -> None:
    clients = connect_spy(monkeypatch, registration)
    engine = await start_engine(runtime, model=f"{runtime}-model", max_context_length=4096)
    got = await register(gateway, {"url": engine.url, "labels": {"zone": "a", "model_path": "/operator/path"}})
    assert got["runtime_type"] == runtime and got["model_id"] == f"{runtime}-model"
    labels = got["labels"]
    assert labels["zone"] == "a" and labels["model_path"] == "/operator/path"  # the operator's label wins
    assert labels["served_model_name"] == f"{runtime}-model" and labels["max_context_length"] == "4096"
    assert labels["tokenizer_path"] == str(MISTRAL) and labels["architectures"] and labels["eos_token_ids"]
    handle = handle_of(got["id"])
    assert handle is not None and handle.record.engine is not None and handle.record.engine.context_length == 4096
    # One short-lived client for detection and GetModelInfo, closed when the job went on.
    assert len(clients) == 1 and not clients[0].channel.is_open


async def test_the_model_card_names_the_model_over_the_engines_name(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory
) -> None:
    engine = await start_engine("vllm")
    got = await register(gateway, {"url": engine.url, "models": [{"id": "card-model"}]})
    assert got["model_id"] == "card-model" and got["labels"]["served_model_name"] == "mock-model"


async def test_a_given_runtime_type_is_used_as_is(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_detection(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("the runtime was given: nothing to detect")

    monkeypatch.setattr(detect, "detect_runtime", no_detection)
    sglang = await start_engine("sglang")
    got = await register(gateway, {"url": sglang.url, "runtime_type": "engine_a"})
    assert got["runtime_type"] == "sglang" and got["model_id"] == "mock-model"
    # Given vllm, a worker serving SGLang's service is asked vLLM's GetModelInfo: registration fails.
    other = await start_engine("sglang")
    await released(gateway, {"url": other.url, "runtime_type": "vllm"})


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_an_unknown_parser_name_is_refused_before_the_worker_is_asked(
    gateway: httpx.AsyncClient,
    fleet: RegistrySync,
    start_engine: EngineFactory,
    start_worker: WorkerFactory,
    transport: str,
) -> None:
    # Refused at the request (400), so no registration job starts (docs/DECISIONS.md D49).
    if transport == "http":
        worker = await start_worker()
        response = await gateway.post("/workers", json={"url": worker.url, "models": [{"id": "m", "tool_parser": "no_such_parser"}]})
        assert worker.requests() == []
    else:
        engine = await start_engine("sglang")
        response = await gateway.post("/workers", json={"url": engine.url, "labels": {"reasoning_parser": "no_such_parser"}})
        assert engine.state.health_checks == 0
    assert response.status_code == 400 and response.json()["code"] == "BAD_REQUEST"
    assert "'no_such_parser'" in response.json()["error"]
    assert (await gateway.get("/workers")).json()["total"] == 0


async def test_an_unreachable_grpc_worker_is_probed_until_it_comes_up(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="administration.reachability")
    attempts = connect_spy(monkeypatch, registration)
    port = free_port()
    response = await gateway.post("/workers", json={"url": f"grpc://127.0.0.1:{port}"})
    worker_id = response.json()["worker_id"]

    async def retried() -> bool:
        return len(attempts) >= 2

    await until(retried)
    await start_engine("vllm", port=port)

    async def ready() -> bool:
        return await status_of(gateway, worker_id) == "ready"

    await until(ready)
    assert (await gateway.get(f"/workers/{worker_id}")).json()["runtime_type"] == "vllm"
    clients = [made for made in attempts if isinstance(made, EngineClient)]
    assert len(clients) == 1 and not clients[0].channel.is_open  # type: ignore[attr-defined]
    # Why it could not be reached (its gRPC status) is logged once, not at each of the retries, and
    # once that it answers.
    logged = [r.getMessage() for r in caplog.records
              if r.name == "administration.reachability" and "(registration)" in r.getMessage()]
    assert len(logged) == 2 and len(attempts) > len(logged), logged
    assert "cannot be reached (registration)" in logged[0] and "UNAVAILABLE" in logged[0]
    assert "answers again (registration)" in logged[1]


async def test_a_grpc_worker_that_never_answers_fails_registration(
    gateway: httpx.AsyncClient, fleet: RegistrySync, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="administration.registration")
    install_config(dataclasses.replace(current_config(), worker_startup_timeout_secs=1.0), export=False)
    attempts = connect_spy(monkeypatch, registration)
    await released(gateway, {"url": f"grpc://127.0.0.1:{free_port()}"})
    assert len(attempts) >= 2 and all(isinstance(made, Exception) for made in attempts)
    assert any("did not answer within 1 s" in record.getMessage() for record in caplog.records)


# --- health checks and load polls ------------------------------------------------------------------


async def test_health_checks_ask_the_engines_health_check_on_the_shared_channel(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory
) -> None:
    engine = await start_engine("sglang")
    got = await register(gateway, {"url": engine.url})
    worker_id = got["id"]

    async def status(wanted: str) -> None:
        async def reached() -> bool:
            return await status_of(gateway, worker_id) == wanted

        await until(reached)

    engine.state.healthy = False  # HealthCheck answers healthy=false
    await status("not_ready")
    engine.state.healthy = True
    await status("ready")
    checks = engine.state.health_checks
    await engine.stop(None)  # HealthCheck fails: the engine is gone
    await status("not_ready")
    assert checks > 3
    handle = next(h for h in REGISTRY.snapshot.workers if h.id == worker_id)
    client = data_plane().engines.client(handle.record)
    assert len(data_plane().engines) == 1 and client.channel.opened == 1  # type: ignore[attr-defined]


async def test_loads_of_a_grpc_worker_come_from_get_loads(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory
) -> None:
    engine = await start_engine("sglang")
    engine.state.loads = [
        {"num_running_reqs": 2, "num_waiting_reqs": 3, "num_used_tokens": 1000, "max_total_num_tokens": 4000},
        {"num_waiting_reqs": 2, "token_usage": 0.5, "gen_throughput": 12.5},
    ]
    got = await register(gateway, {"url": engine.url, "overload": {"waiting_requests": 4}})

    async def polled() -> bool:
        return any(target.worker_id == got["id"] for target in fleet.loads.targets)

    await until(polled)
    await fleet.loads.apoll()
    body = (await gateway.get("/loads")).json()
    first, second = body["loads"]
    assert (first["worker"], first["worker_type"], first["dp_rank"], second["dp_rank"]) == (engine.url, "regular", 0, 1)
    assert (first["num_running_reqs"], first["num_waiting_reqs"], first["num_total_reqs"]) == (2, 3, 5)
    assert first["token_usage"] == pytest.approx(0.25)  # unreported: from the used and total tokens
    assert first["utilization"] == pytest.approx(2 / 256) and second["token_usage"] == pytest.approx(0.5)
    assert body["aggregate"]["total_waiting_reqs"] == 5 and body["aggregate"]["avg_throughput"] == pytest.approx(6.25)
    load = REGISTRY.load_of(got["id"])
    assert load is not None and load.overloaded  # 5 waiting >= 4: out of routing


async def test_a_runtime_without_get_loads_is_not_reported_and_said_once(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="administration.loads")
    engine = await start_engine("mlx")
    got = await register(gateway, {"url": engine.url})
    assert got["runtime_type"] == "mlx"  # detected last in the order

    async def polled() -> bool:
        return any(target.worker_id == got["id"] for target in fleet.loads.targets)

    await until(polled)
    for _ in range(3):
        await fleet.loads.apoll()
    assert (await gateway.get("/loads")).json()["loads"] == []
    said = [record.getMessage() for record in caplog.records if "reports no load" in record.getMessage()]
    assert len(said) == 1 and "mlx has no GetLoads" in said[0] and f"{NO_LOAD_ROUTE_RETRY_SECS:g} s" in said[0]


# --- flush and profiling fan-outs ---------------------------------------------------------------------


async def test_flush_and_profiling_reach_grpc_workers_through_the_shared_clients(
    gateway: httpx.AsyncClient,
    fleet: RegistrySync,
    start_engine: EngineFactory,
    worker: RunningWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sglang, vllm = await start_engine("sglang"), await start_engine("vllm")
    for url in (sglang.url, vllm.url, worker.url):
        await register(gateway, {"url": url})
    short_lived = connect_spy(monkeypatch, fanout)
    flushed = await gateway.post("/flush_cache")
    assert flushed.status_code == 200, flushed.text
    body = flushed.json()
    assert (body["workers_flushed"], body["total_http_workers"], body["total_grpc_workers"]) == (3, 1, 2)
    assert sglang.state.flushes == vllm.state.flushes == 1
    options = {"output_dir": "/tmp/profiles", "num_steps": 3, "activities": ["CPU"]}
    started = await gateway.post("/start_profile", json=options)
    assert started.status_code == 200
    assert sorted(started.json()["successful"]) == sorted([sglang.url, vllm.url, worker.url])
    stopped = await gateway.post("/stop_profile", json={"url": vllm.url})
    assert stopped.status_code == 200 and stopped.json()["successful"] == [vllm.url]
    assert (sglang.state.profiles, vllm.state.profiles) == (["start"], ["start", "stop"])
    assert short_lived == [] and len(data_plane().engines) == 2  # the health checks' clients, no other


async def test_runtimes_without_the_rpcs_are_reported_under_failed(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory
) -> None:
    sglang, trtllm = await start_engine("sglang"), await start_engine("trtllm")
    await register(gateway, {"url": sglang.url})
    assert (await register(gateway, {"url": trtllm.url}))["runtime_type"] == "trtllm"
    flushed = await gateway.post("/flush_cache")
    assert flushed.status_code == 206
    body = flushed.json()
    assert body["status"] == "partial_success" and body["successful"] == [sglang.url]
    assert body["failed"] == [{"worker": trtllm.url, "error": "trtllm has no FlushCache"}]
    started = await gateway.post("/start_profile", json={})
    assert started.status_code == 206 and started.json()["successful"] == [sglang.url]
    assert started.json()["failed"] == [{"worker": trtllm.url, "error": "trtllm has no StartProfile"}]
    assert (await gateway.post("/stop_profile", json={"url": "grpc://127.0.0.1:1"})).status_code == 404
    invalid = await gateway.post("/start_profile", json={"url": sglang.url, "num_steps": "three"})
    assert invalid.status_code == 206 and "invalid profiling options" in invalid.json()["failed"][0]["error"]
    assert sglang.state.profiles == ["start"]


async def test_off_the_serving_loop_the_fan_out_uses_short_lived_clients(
    make_gateway: GatewayFactory, start_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await start_engine("sglang")
    dead = record_for(f"grpc://127.0.0.1:{free_port()}", model="m")
    gateway = make_gateway([record_for(engine.url, model="mock-model"), dead])  # no fleet loop here
    clients = connect_spy(monkeypatch, fanout)
    response = await gateway.post("/flush_cache")
    assert response.status_code == 206 and response.json()["successful"] == [engine.url]
    (failed,) = response.json()["failed"]
    assert failed["worker"] == dead.url and "UNAVAILABLE" in failed["error"]
    assert engine.state.flushes == 1 and len(data_plane().engines) == 0
    opened = [made for made in clients if isinstance(made, EngineClient)]
    assert len(opened) == 2 and not any(client.channel.is_open for client in opened)  # type: ignore[attr-defined]


# --- worker information routes, the client's lifetime ---------------------------------------------


@pytest.mark.parametrize("path", ["/get_model_info", "/get_server_info", "/health_generate"])
async def test_a_grpc_only_fleet_answers_501_and_an_http_worker_beside_it_answers(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory, worker: RunningWorker, path: str
) -> None:
    engine = await start_engine("sglang")
    await register(gateway, {"url": engine.url})
    refused = await gateway.get(path)
    assert refused.status_code == 501 and refused.json()["error"]["code"] == "endpoint_not_supported"
    assert "gRPC workers" in refused.json()["error"]["message"]
    await register(gateway, {"url": worker.url})
    assert (await gateway.get(path)).status_code == 200
    assert [r for r in worker.requests() if r["path"] == path]


async def test_the_engine_client_is_closed_when_its_worker_leaves(
    gateway: httpx.AsyncClient, fleet: RegistrySync, start_engine: EngineFactory
) -> None:
    engine = await start_engine("vllm")
    got = await register(gateway, {"url": engine.url})
    handle = handle_of(got["id"])
    assert handle is not None
    client = data_plane().engines.client(handle.record)  # the health checks' client
    assert client.channel.is_open and len(data_plane().engines) == 1  # type: ignore[attr-defined]
    assert (await gateway.delete(f"/workers/{got['id']}")).status_code == 202

    async def closed() -> bool:
        await asyncio.sleep(0)
        return len(data_plane().engines) == 0 and not client.channel.is_open  # type: ignore[attr-defined]

    await until(closed)
