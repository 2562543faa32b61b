"""Hundreds of workers, served by one stand-in listening on as many loopback ports: registered at
start-up (--worker-urls) while more register through the admin API at the same time, every one of
them probed, ready and routable, by deltas (the fleet is read whole once); GET /workers lists them
all; the fleet stops promptly."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest
from aiohttp import web
from django.test import AsyncClient

from administration.models import Worker, WorkerStatus
from administration import registry_sync
from administration.registry_sync import RegistrySync
from common.config import GatewayConfig, install_config
from inference.routing.registry import REGISTRY
from standins.mock_worker import MockWorkerConfig, build_app
from tests.conftest import free_port, until

pytestmark = [pytest.mark.django_db(transaction=True)]

AT_START = 150
THROUGH_API = 50


@pytest.fixture
async def one_worker_many_ports() -> AsyncIterator[list[str]]:
    runner = web.AppRunner(build_app(MockWorkerConfig(model="fleet-model")), access_log=None)
    await runner.setup()
    urls = []
    for _ in range(AT_START + THROUGH_API):
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        urls.append(f"http://127.0.0.1:{port}")
    yield urls
    await runner.cleanup()


async def test_hundreds_of_workers_register_at_start_and_through_the_api_together(
    one_worker_many_ports: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry_sync, "FULL_RELOAD_SECS", 3600.0)  # every change arrives as a delta
    at_start, through_api = one_worker_many_ports[:AT_START], one_worker_many_ports[AT_START:]
    config = GatewayConfig(
        worker_urls=tuple(at_start), health_check_interval_secs=1.0, worker_startup_check_interval=0.5,
        load_monitor_interval=1.0,
    )
    install_config(config, export=False)
    fleet = RegistrySync(config)
    try:
        api = AsyncClient()
        started = asyncio.ensure_future(fleet.astart())
        answers = await asyncio.gather(*(
            api.post("/workers", {"url": url}, content_type="application/json") for url in through_api
        ))
        assert [answer.status_code for answer in answers] == [202] * THROUGH_API
        await started

        async def all_ready() -> bool:
            return len(REGISTRY.snapshot.routable) == AT_START + THROUGH_API

        await until(all_ready, timeout=120)
        assert await Worker.objects.filter(status=WorkerStatus.READY).acount() == AT_START + THROUGH_API
        listed = (await api.get("/workers")).json()
        assert listed["total"] == AT_START + THROUGH_API and len(listed["workers"]) == AT_START + THROUGH_API
        # The whole fleet was read at start-up (once more at most, when a burst of changes outgrew one
        # read of the log); registrations and transitions came as deltas, worker by worker.
        assert fleet.full_reloads <= 2
        assert fleet.deltas >= AT_START + THROUGH_API
    finally:
        stopping = asyncio.ensure_future(fleet.astop())
        await asyncio.wait_for(stopping, 10)  # a large fleet stops promptly
        REGISTRY.publish([], {})
        install_config(GatewayConfig(), export=False)
