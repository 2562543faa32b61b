"""Registering ZMQ workers (ipc://) through POST /workers, with real registration jobs, the fleet's
health checks and the project's EngineCore stand-in dialing in: a worker that passes is pending
until its engines finished the handshake with the gateway's bound sockets, then ready; each of the
spec's ZMQ registration failures releases the worker (404) with its reason."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from django.test import AsyncClient

from administration.models import Worker
from administration.zmq_workers import handshake_address_refusal
from administration.registry_sync import RegistrySync
from common.config import GatewayConfig, parse_gateway_args
from inference.dataplane import data_plane
from inference.routing.breaker import BreakerState
from inference.routing.registry import REGISTRY
from standins.fixtures import FIXTURE_MODELS
from standins.zmq_engine import ZmqEngineConfig, ZmqEngineGroup
from tests.administration.fleet import running_fleet
from tests.conftest import free_port, until

pytestmark = pytest.mark.django_db(transaction=True)

QWEN = str(FIXTURE_MODELS / "qwen3")
FAST = GatewayConfig(
    worker_startup_check_interval=0.2, worker_startup_timeout_secs=1.0, health_check_interval_secs=0.2,
    health_success_threshold=1, health_failure_threshold=2, health_check_timeout_secs=2.0,
)  # fmt: skip


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


@pytest.fixture
async def fleet() -> AsyncIterator[RegistrySync]:
    async with running_fleet(FAST) as running:
        yield running
    await data_plane().engines.aclose()  # unbind the ZMQ workers' sockets


@pytest.fixture
def api() -> AsyncClient:
    return AsyncClient()


def zmq_body(ipc_dir: Path, **fields: Any) -> dict[str, Any]:
    return {
        "url": f"ipc://{ipc_dir}/engine", "runtime": "vllm",
        "models": [{"id": "Qwen/Qwen3-8B", "tokenizer_path": QWEN}],
        "zmq_handshake_address": f"tcp://127.0.0.1:{free_port()}", **fields,
    }  # fmt: skip


async def test_a_zmq_worker_is_ready_once_its_engines_handshake(api, fleet, ipc_dir: Path) -> None:
    body = zmq_body(ipc_dir, dp_size=2, health={"disable_health_check": True})  # ignored for ZMQ
    response = await api.post("/workers", body, content_type="application/json")
    assert response.status_code == 202, response.content
    location = response.json()["location"]

    async def registered() -> bool:
        got = await api.get(location)
        return got.status_code == 200 and "job_status" not in got.json()

    await until(registered)
    worker = (await api.get(location)).json()
    assert worker["status"] == "pending"  # health checks stay on: nothing dialed in yet
    assert worker["connection_mode"] == "zmq" and worker["runtime_type"] == "vllm" and worker["dp_size"] == 2
    group = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN), body["zmq_handshake_address"], dp_size=2)
    await group.start()
    try:

        async def ready() -> bool:
            return (await api.get(location)).json()["status"] == "ready"

        await until(ready)
        flushed = await api.post("/flush_cache")
        assert flushed.json()["total_zmq_workers_skipped"] == 1
        handle = REGISTRY.snapshot.workers[0]
        assert handle.record.engine is not None and handle.record.engine.dp_size == 2

        async def loads_read() -> bool:
            # The load monitor reads the client's per-rank scheduler stats, once the published
            # snapshot routes the worker as ready (the store says ready a moment before).
            await fleet.loads.apoll()
            ranks = [entry["dp_rank"] for entry in REGISTRY.snapshot.workers[0].load.engine_load or ()]
            return ranks == [0, 1]

        await until(loads_read)
    finally:
        await group.stop()


async def test_a_dead_engine_leaves_the_worker_not_ready_until_its_engines_handshake_again(
    api, fleet, ipc_dir: Path
) -> None:
    """Spec 3's worker status: ZMQ health checks stay on, so an engine that sent ENGINE_CORE_DEAD
    fails the probes and after failure_threshold of them the worker is not_ready (out of rotation;
    GET /workers shows it not healthy); the breaker counts requests, not probes, and stays closed;
    once engines handshake again the probes succeed and the worker is ready."""
    body = zmq_body(ipc_dir, health={"disable_health_check": True})  # ignored for ZMQ
    location = (await api.post("/workers", body, content_type="application/json")).json()["location"]

    async def status_is(status: str) -> bool:
        got = await api.get(location)
        return got.status_code == 200 and got.json().get("status") == status

    group = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN), body["zmq_handshake_address"])
    await group.start()
    try:
        await until(lambda: status_is("ready"))
        await group.engines[0].die()
        await until(lambda: status_is("not_ready"))
        shown = (await api.get(location)).json()
        assert shown["is_healthy"] is False
        listed = [w for w in (await api.get("/workers")).json()["workers"] if w["url"] == body["url"]]
        assert [(w["status"], w["is_healthy"]) for w in listed] == [("not_ready", False)]

        async def out_of_rotation() -> bool:  # the published snapshot follows the store a moment later
            return "Qwen/Qwen3-8B" not in REGISTRY.snapshot.routable_models

        await until(out_of_rotation)
        assert REGISTRY.snapshot.workers[0].load.breaker.state is BreakerState.CLOSED
    finally:
        await group.stop()
    again = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN), body["zmq_handshake_address"])
    await again.start()
    try:
        await until(lambda: status_is("ready"))
        assert (await api.get(location)).json()["is_healthy"] is True

        async def back_in_rotation() -> bool:
            return "Qwen/Qwen3-8B" in REGISTRY.snapshot.routable_models

        await until(back_in_rotation)
    finally:
        await again.stop()


async def test_an_ipc_worker_without_a_runtime_is_sglang_over_the_same_wire(api, fleet, ipc_dir: Path) -> None:
    body = zmq_body(ipc_dir)
    del body["runtime"]
    response = await api.post("/workers", body, content_type="application/json")
    location = response.json()["location"]

    async def registered() -> bool:
        got = await api.get(location)
        return got.status_code == 200 and "job_status" not in got.json()

    await until(registered)
    assert (await api.get(location)).json()["runtime_type"] == "sglang"


def _bound(address: str) -> zmq.Socket:  # type: ignore[type-arg]
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(address)
    return socket


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"runtime": "mlx"}, "runtime must be one of sglang, vllm, trtllm"),
        ({"worker_type": "prefill"}, "must be a regular worker"),
        ({"models": None}, "needs a model id"),
        ({"zmq_handshake_address": "ipc:///tmp/handshake"}, "must be a tcp:// address"),
        ({"models": [{"id": "some/model"}]}, "has no tokenizer"),
        ({"bound": True}, "is already bound"),
    ],
)
async def test_zmq_registration_failures(api, fleet, ipc_dir: Path, caplog, change: dict[str, Any], reason: str) -> None:
    body = zmq_body(ipc_dir)
    held = None
    if change.pop("bound", False):
        held = _bound(body["zmq_handshake_address"])
    for key, value in change.items():
        if value is None:
            body.pop(key)
        else:
            body[key] = value
    caplog.set_level(logging.ERROR, logger="administration.registration")
    try:
        await _fails(api, body)
    finally:
        if held is not None:
            held.close()
    assert reason in caplog.text


async def test_handshake_address_on_a_worker_that_is_not_zmq_fails(api, fleet, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="administration.registration")
    await _fails(api, {"url": f"grpc://127.0.0.1:{free_port()}", "zmq_handshake_address": "tcp://127.0.0.1:1"})
    assert "zmq_handshake_address is for ZMQ (ipc://) workers only" in caplog.text


async def test_zmq_refusals_of_the_gateway_config(api, ipc_dir: Path, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="administration.registration")
    async with running_fleet(GatewayConfig(dp_aware=True)):
        await _fails(api, zmq_body(ipc_dir, dp_size=2))
    assert "dp_size 2 above 1 is not supported for ZMQ workers under --dp-aware" in caplog.text


async def test_zmq_workers_are_registered_under_several_serving_processes(api, ipc_dir: Path) -> None:
    """``--workers`` above 1 no longer refuses ZMQ workers (each serving process is a client of the
    engines, D69; served end to end by e2e/test_zmq_serving_processes.py): at the command line and
    through POST /workers."""
    config = parse_gateway_args(["--worker-urls", f"ipc://{ipc_dir}/engine", "--workers", "2"])
    assert config.workers == 2 and config.worker_urls == (f"ipc://{ipc_dir}/engine",)
    async with running_fleet(GatewayConfig(workers=2, health_check_interval_secs=60)):
        body = zmq_body(ipc_dir)
        response = await api.post("/workers", body, content_type="application/json")
        assert response.status_code == 202, response.content
        location = response.json()["location"]

        async def registered() -> bool:
            got = await api.get(location)
            return got.status_code == 200 and "job_status" not in got.json()

        await until(registered)
        assert (await api.get(location)).json()["status"] == "pending"  # until its engines dial in
    await data_plane().engines.aclose()


async def test_model_path_flag_names_the_model(api, ipc_dir: Path) -> None:
    async with running_fleet(GatewayConfig(model_path=QWEN, health_check_interval_secs=60)):
        body = zmq_body(ipc_dir)
        del body["models"]
        response = await api.post("/workers", body, content_type="application/json")
        location = response.json()["location"]

        async def registered() -> bool:
            got = await api.get(location)
            return got.status_code == 200 and "job_status" not in got.json()

        await until(registered)
        shown = (await api.get(location)).json()
        assert shown["labels"]["model_path"] == QWEN
        assert await Worker.objects.filter(url=body["url"]).values_list("model_id", flat=True).aget() == QWEN
    await data_plane().engines.aclose()


async def _fails(api: AsyncClient, body: dict[str, Any]) -> None:
    response = await api.post("/workers", body, content_type="application/json")
    assert response.status_code == 202, response.content
    location = response.json()["location"]

    async def released() -> bool:
        return (await api.get(location)).status_code == 404

    await until(released)


def test_the_bound_check_does_not_take_a_dialing_engines_hello(ipc_dir: Path) -> None:
    """Registration checks the handshake address by binding it for a moment. An engine already
    dialing in (its DEALER retrying the connect) must not have its HELLO accepted by that momentary
    socket and lost: the check binds a plain socket that never listens, so the engine is refused
    and retries, and the gateway's real handshake socket gets the HELLO."""
    address = f"tcp://127.0.0.1:{free_port()}"
    context = zmq.Context()
    try:
        engine = context.socket(zmq.DEALER)
        engine.setsockopt(zmq.LINGER, 0)
        engine.setsockopt(zmq.RECONNECT_IVL, 1)  # retries the connect every millisecond
        engine.connect(address)
        engine.send(b"HELLO")
        for _ in range(200):
            assert handshake_address_refusal(f"ipc://{ipc_dir}/engine", address) is None
        gateway = context.socket(zmq.ROUTER)
        gateway.setsockopt(zmq.LINGER, 0)
        gateway.bind(address)
        assert gateway.poll(5000), "the HELLO was lost"
        assert gateway.recv_multipart()[1] == b"HELLO"
        assert handshake_address_refusal(f"ipc://{ipc_dir}/engine", address) == (
            f"the handshake address {address} is already bound"
        )  # held by the gateway's socket now
    finally:
        context.destroy(linger=0)
