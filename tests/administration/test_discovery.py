"""DataPlane and model discovery over HTTP, and the fleet that makes workers routable."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from administration.discovery import WorkerRefused, WorkerUnreachable, discover_http_worker
from administration.registry_sync import RegistrySync
from administration.models import Worker, WorkerSource, WorkerStatus
from inference.routing.workers import normalize_runtime_type
from common.config import GatewayConfig, install_config
from inference.routing.registry import REGISTRY
from tests.conftest import free_port, until


@pytest.mark.parametrize(
    ("owned_by", "runtime"),
    [("sglang", "sglang"), ("vllm", "vllm"), ("someone", "generic")],
)
async def test_runtime_is_detected(start_worker, owned_by: str, runtime: str) -> None:
    worker = await start_worker(model="llama-3", owned_by=owned_by)
    with httpx.Client() as client:
        found = await asyncio.to_thread(discover_http_worker, client, worker.url, None)
    assert found.runtime_type == runtime
    assert found.model_id == "llama-3"


async def test_configured_runtime_is_kept(start_worker) -> None:
    worker = await start_worker(owned_by="vllm")
    with httpx.Client() as client:
        found = await asyncio.to_thread(discover_http_worker, client, worker.url, None, "trtllm")
    assert found.runtime_type == "trtllm"


async def test_discovery_presents_the_worker_key(start_worker) -> None:
    worker = await start_worker(api_key="sk-w")
    with httpx.Client() as client:
        found = await asyncio.to_thread(discover_http_worker, client, worker.url, "sk-w")
    assert found.model_id == worker.model


@pytest.mark.parametrize("key", [None, "sk-not-the-workers"])
async def test_a_worker_refusing_the_key_is_refused_not_generic(start_worker, key: str | None) -> None:
    worker = await start_worker(api_key="sk-w")
    with httpx.Client() as client:
        with pytest.raises(WorkerRefused) as refused:
            await asyncio.to_thread(discover_http_worker, client, worker.url, key)
    assert "HTTP 401" in str(refused.value)
    assert key is None or key not in str(refused.value)


def test_unreachable_worker_raises() -> None:
    with httpx.Client() as client:
        with pytest.raises(WorkerUnreachable):
            discover_http_worker(client, "http://127.0.0.1:9", None)


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("engine_a", "sglang"), ("engine_b", "vllm"), ("engine_c", "trtllm"), ("tensorrt-llm", "trtllm"),
     ("engine_d", "mlx"), ("engine_e", "tokenspeed"), ("SGLang", "sglang"), ("generic", "generic")],
)
def test_runtime_aliases_are_stored_as_real_names(given: str, canonical: str) -> None:
    assert normalize_runtime_type(given) == canonical


def test_unknown_runtime_is_rejected() -> None:
    with pytest.raises(ValueError):
        normalize_runtime_type("engine_z")


@pytest.fixture
def fleet_config(settings):
    config = GatewayConfig(worker_startup_check_interval=0.5, health_check_interval_secs=0.2)
    install_config(config, export=False)
    yield config
    install_config(GatewayConfig(), export=False)


@pytest.mark.django_db(transaction=True)
async def test_worker_that_comes_up_later_becomes_routable(fleet_config) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = dataclasses.replace(fleet_config, worker_urls=(url,))
    install_config(config, export=False)
    fleet = RegistrySync(config)
    runner = None
    try:
        snapshot = await fleet.astart()
        assert not snapshot.routable
        await asyncio.sleep(0.3)
        from aiohttp import web

        from standins.mock_worker import MockWorkerConfig, build_app

        runner = web.AppRunner(build_app(MockWorkerConfig(model="late-model", owned_by="vllm")))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

        async def routable() -> bool:
            return bool(REGISTRY.snapshot.routable)

        await until(routable)
        assert REGISTRY.snapshot.routable_models == ("late-model",)
        stored = await Worker.objects.aget(url=url)
        assert (stored.status, stored.runtime_type, stored.model_id, stored.source, stored.registered) == (
            WorkerStatus.READY, "vllm", "late-model", WorkerSource.CLI, True
        )
    finally:
        await fleet.astop()
        if runner is not None:
            await runner.cleanup()
        REGISTRY.publish([], {})


@pytest.mark.django_db(transaction=True)
async def test_stale_cli_workers_are_removed_and_api_workers_kept(worker, fleet_config) -> None:
    await Worker.objects.acreate(url="http://old-cli:1", source=WorkerSource.CLI, registered=True)
    await Worker.objects.acreate(url="http://api-added:1", source=WorkerSource.API, status=WorkerStatus.READY, model_id="x", registered=True)
    fleet = RegistrySync(dataclasses.replace(fleet_config, worker_urls=(worker.url,)))
    try:
        await fleet.astart()
        urls = sorted([w.url async for w in Worker.objects.all()])
        assert urls == sorted(["http://api-added:1", worker.url])
    finally:
        await fleet.astop()
        REGISTRY.publish([], {})


@pytest.mark.django_db(transaction=True)
async def test_cli_worker_that_never_answers_is_released(fleet_config) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    config = dataclasses.replace(fleet_config, worker_urls=(url,), worker_startup_timeout_secs=0.6, worker_startup_check_interval=0.2)
    install_config(config, export=False)
    fleet = RegistrySync(config)
    try:
        await fleet.astart()

        async def gone() -> bool:
            return not await Worker.objects.filter(url=url).aexists()

        await until(gone)
    finally:
        await fleet.astop()
        REGISTRY.publish([], {})
