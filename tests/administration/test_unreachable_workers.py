"""A worker that is not up yet, or stops answering: GET /workers and manage.py list_workers show it
(status pending, job AddWorker) while registration probes it, and the log says why it cannot be
reached once when it first fails and once when it answers, not at every retry. Real registration
jobs (in-process job threads), a running fleet's health checks, real mock workers on loopback."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid
from typing import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from django.core.management import call_command
from django.test import AsyncClient

from administration.models import Worker
from administration.registry_sync import RegistrySync
from administration.workers import drain_worker
from common.config import GatewayConfig
from standins.mock_worker import MockWorkerConfig, build_app, mock_state
from tests.administration.fleet import running_fleet
from tests.conftest import free_port, until

pytestmark = pytest.mark.django_db(transaction=True)

PATIENT = GatewayConfig(
    worker_startup_check_interval=0.1,
    worker_startup_timeout_secs=60.0,
    health_check_interval_secs=0.1,
    health_success_threshold=1,
    health_failure_threshold=2,
)


@pytest.fixture
async def fleet() -> AsyncIterator[RegistrySync]:
    async with running_fleet(PATIENT) as running:
        yield running


class HangUp:
    """A listener that takes each connection and closes it without a word: a worker not up yet
    (its port open, its server not answering). Counts the connections, so a test knows how many
    probes came."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self, port: int) -> None:
        async def take(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(take, "127.0.0.1", port, reuse_address=True)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def serve_mock(port: int) -> web.AppRunner:
    """The mock worker on ``port`` (where a test said a worker would come up)."""
    runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model")), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    return runner


def messages(caplog: pytest.LogCaptureFixture, url: str, what: str) -> list[str]:
    return [
        record.getMessage() for record in caplog.records
        if record.name == "administration.reachability" and url in record.getMessage()
        and f"({what})" in record.getMessage()
    ]


async def reaches(check: Callable[[], Awaitable[bool]]) -> None:
    await until(check, timeout=20.0)


def list_workers(*args: str) -> str:
    out = io.StringIO()
    call_command("list_workers", *args, stdout=out)
    return out.getvalue()


async def test_a_worker_not_up_yet_is_shown_and_logged_once_each_way(
    fleet: RegistrySync, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="administration.reachability")
    api = AsyncClient()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    response = await api.post("/workers", {"url": url, "labels": {"zone": "a"}}, content_type="application/json")
    worker_id = response.json()["worker_id"]

    async def failing() -> bool:
        return len(messages(caplog, url, "registration")) == 1

    await reaches(failing)  # nothing listens: connection refused
    listing = (await api.get("/workers")).json()
    # The spec's list leaves out a worker whose registration runs; it is shown beside the list.
    assert (listing["workers"], listing["total"]) == ([], 0)
    assert listing["stats"] == {"prefill_count": 0, "decode_count": 0, "regular_count": 0}
    [shown] = listing["registering"]
    assert (shown["id"], shown["url"], shown["status"], shown["is_healthy"]) == (worker_id, url, "pending", False)
    assert shown["job_status"]["job_type"] == "AddWorker" and shown["job_status"]["status"] == "processing"
    assert shown["connection_mode"] == "http" and shown["labels"] == {"zone": "a"}
    assert (await api.get("/workers?model=other")).json()["registering"] == [shown]  # no model list: any
    [logged] = messages(caplog, url, "registration")
    assert "ConnectError" in logged and "Connection refused" in logged, logged

    table = await asyncio.to_thread(list_workers)
    [row] = [line for line in table.splitlines() if url in line]
    assert worker_id in row and "pending" in row and "AddWorker processing" in row
    [as_json] = json.loads(await asyncio.to_thread(list_workers, "--json"))
    assert (as_json["id"], as_json["status"], as_json["registered"]) == (worker_id, "pending", False)
    assert as_json["job_status"]["job_type"] == "AddWorker"
    # The console's job column shows why meanwhile.
    assert "Connection refused" in (await Worker.objects.aget(pk=worker_id)).last_error

    hang_up = HangUp()  # its port opens, its server does not answer yet: still unreachable
    await hang_up.start(port)

    async def retried() -> bool:
        return hang_up.connections >= 3

    await reaches(retried)
    await hang_up.stop()
    assert len(messages(caplog, url, "registration")) == 1  # not once per retry, nor per reason

    runner = await serve_mock(port)
    try:
        async def listed() -> bool:
            return (await api.get("/workers")).json()["total"] == 1

        await reaches(listed)
        logged_lines = messages(caplog, url, "registration")
        assert len(logged_lines) == 2 and "answers again" in logged_lines[1], logged_lines
        listing = (await api.get("/workers")).json()
        assert listing["registering"] == [] and listing["workers"][0]["id"] == worker_id
        assert (await Worker.objects.aget(pk=worker_id)).last_error == ""
    finally:
        await runner.cleanup()


async def test_a_worker_that_stops_answering_health_checks_is_logged_once_each_way(
    fleet: RegistrySync, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="administration.reachability")
    api = AsyncClient()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    runner = await serve_mock(port)
    try:
        state = mock_state(runner.app)
        worker_id = (await api.post("/workers", {"url": url}, content_type="application/json")).json()["worker_id"]

        async def status(wanted: str) -> None:
            async def reached() -> bool:
                return (await api.get(f"/workers/{worker_id}")).json().get("status") == wanted

            await reaches(reached)

        await status("ready")
        state.health_status = 503
        probes_before = state.requests_by_path.get("/health", 0)

        async def probed_failing() -> bool:
            return state.requests_by_path.get("/health", 0) >= probes_before + 4

        await reaches(probed_failing)
        await status("not_ready")
        [logged] = messages(caplog, url, "health check")
        assert "HTTP 503" in logged and "/health" in logged, logged

        state.health_status = 200
        await status("ready")
        logged_lines = messages(caplog, url, "health check")
        assert len(logged_lines) == 2 and "answers again" in logged_lines[1], logged_lines
        # Every worker shows in GET /workers whatever its health: not_ready and draining ones too.
        await asyncio.to_thread(drain_worker, uuid.UUID(worker_id))
        assert [w["status"] for w in (await api.get("/workers")).json()["workers"]] == ["draining"]
        assert "draining" in await asyncio.to_thread(list_workers)
    finally:
        await runner.cleanup()
