"""manage.py add_worker, list_workers, drain_worker, remove_worker: output and exit codes."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from django.core.management import CommandError, call_command

from administration.models import Worker, WorkerStatus
from common.config import GatewayConfig, install_config

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def fast_config():
    install_config(GatewayConfig(worker_startup_timeout_secs=1.0, worker_startup_check_interval=0.2, drain_settle_secs=0.1), export=False)
    yield
    install_config(GatewayConfig(), export=False)


async def test_add_list_drain_remove(worker) -> None:
    added = await asyncio.to_thread(run, "add_worker", worker.url, "--label", "zone=a", "--priority", "7")
    assert "registered" in added and "runtime sglang" in added and "model mock-model" in added
    listing = await asyncio.to_thread(run, "list_workers")
    assert worker.url in listing and "pending" in listing  # health checks run in the gateway process
    rows = json.loads(await asyncio.to_thread(run, "list_workers", "--json"))
    assert rows[0]["url"] == worker.url and rows[0]["model_id"] == "mock-model"
    await Worker.objects.filter(url=worker.url).aupdate(status=WorkerStatus.READY)
    drained = await asyncio.to_thread(run, "drain_worker", worker.url)
    assert "draining" in drained
    removed = await asyncio.to_thread(run, "remove_worker", rows[0]["id"])
    assert "removed" in removed
    assert not await Worker.objects.aexists()


async def test_add_worker_reports_failures() -> None:
    with pytest.raises(CommandError, match="scheme"):
        await asyncio.to_thread(run, "add_worker", "ftp://nowhere:1")
    with pytest.raises(CommandError, match="registration of http://127.0.0.1:9 failed"):
        await asyncio.to_thread(run, "add_worker", "http://127.0.0.1:9")
    with pytest.raises(CommandError, match="KEY=VALUE"):
        await asyncio.to_thread(run, "add_worker", "http://x:1", "--label", "novalue")


def test_unknown_worker_is_an_error() -> None:
    with pytest.raises(CommandError, match="No worker"):
        run("remove_worker", "http://not-registered:1")
    with pytest.raises(CommandError, match="not found"):
        run("drain_worker", "7f1c0e4e-0000-4000-8000-000000000000")


def test_empty_list() -> None:
    assert "no workers registered" in run("list_workers")
