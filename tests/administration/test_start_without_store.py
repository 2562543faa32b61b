"""A gateway whose store does not answer at start-up still starts (D79): the registry sync returns
an empty snapshot at once, /readiness answers 503 naming the store, control routes that need the
store answer 503, and when the store answers the first load runs by itself: the --worker-urls are
registered, the loops start, and the worker is routed. The store's refusal is the real error path
(an OperationalError through common.db, which reports the outage); the real Postgres at a
closed port is tests/e2e/test_service_outages.py."""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

import httpx
import pytest
from django.db import OperationalError

from administration import registry_sync
from common.db import arun_db
from administration.registry_sync import RegistrySync
from common.config import current_config
from common.outages import STORE
from inference.dataplane import data_plane
from inference.routing.registry import REGISTRY
from tests.conftest import GatewayFactory, WorkerFactory, until

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class Store:
    """The registry sync's store calls, refused while ``down`` (as Postgres at a closed port is)."""

    def __init__(self) -> None:
        self.down = True
        self.refused = 0

    async def arun_db(self, func: Callable[..., T], *args: Any) -> T:
        if self.down:
            self.refused += 1

            def refuse() -> T:
                raise OperationalError("connection failed: Connection refused")

            return await arun_db(refuse)
        return await arun_db(func, *args)


async def test_starts_without_the_store_and_catches_up_when_it_answers(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = await start_worker()
    gateway = make_gateway([], worker_urls=(worker.url,), worker_startup_check_interval=0.2,
                           health_check_interval_secs=0.2, health_success_threshold=1)
    store = Store()
    monkeypatch.setattr(registry_sync, "arun_db", store.arun_db)
    sync = RegistrySync(current_config())
    caplog.set_level(logging.INFO)
    try:
        snapshot = await sync.astart()
        assert snapshot.workers == () and store.refused == 1
        assert STORE.down
        ready = await gateway.get("/readiness")
        assert ready.status_code == 503
        assert ready.json() == {"status": "not_ready", "workers": {"ready": 0, "total": 0}, "waiting_for": "store"}
        assert (await gateway.get("/liveness")).status_code == 200
        listing = await gateway.get("/workers")  # the control plane's envelope, not a 500
        assert listing.status_code == 503 and listing.json()["code"] == "SERVICE_UNAVAILABLE"
        assert sync._tasks and all(not task.done() for task in sync._tasks)  # only the first-load retry
        assert len(sync._tasks) == 1
        # No model is unknown before the registry is read: a request naming one waits (503), not 404.
        early = await gateway.post("/v1/chat/completions", json=CHAT)
        assert early.status_code == 503, early.text
        assert early.json()["error"]["code"] == "no_healthy_workers"

        store.down = False
        await until(lambda: _ready(gateway), timeout=20)
        answer = await gateway.post("/v1/chat/completions", json=CHAT)
        assert answer.status_code == 200, answer.text
        assert data_plane().waiting_for is None
        assert [handle.url for handle in REGISTRY.snapshot.workers] == [worker.url]
        assert len(sync._tasks) > 1  # the change poll and the safety net run now
    finally:
        await sync.astop()
        STORE.recovered()
    messages = [record.getMessage() for record in caplog.records]
    assert sum("started without the store" in m for m in messages) == 1, messages
    assert sum(m.startswith("registry loaded from the store") for m in messages) == 1, messages
    assert sum("the store (database) unavailable" in m for m in messages) == 1, messages
    assert sum("the store (database) reachable again" in m for m in messages) == 1, messages


async def _ready(gateway: httpx.AsyncClient) -> bool:
    return (await gateway.get("/readiness")).status_code == 200
