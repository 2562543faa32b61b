"""Discovery registers what it found in batches (D84): one store write reserves a batch's rows, and
whatever fails inside a batch fails only its own worker, visibly (its refusal returned or logged),
while the rest of the batch registers."""

from __future__ import annotations

import asyncio
import logging

import pytest

from administration.discovery_reconcile import PROVIDER_LABEL, DiscoveredWorker, reconcile
from administration.jobs import wait_for_local_jobs
from administration.models import Worker, WorkerStatus
from administration.worker_spec import parse_worker_spec
from administration.workers import WorkerAlreadyExists, WorkerCreateInProgress, create_worker, create_workers
from common.config import GatewayConfig, install_config
from tests.conftest import WorkerFactory, free_port


@pytest.fixture
def quick_config():
    install_config(GatewayConfig(worker_startup_check_interval=0.2, worker_startup_timeout_secs=1, disable_health_check=True), export=False)
    yield
    install_config(GatewayConfig(), export=False)


def _registered(urls: list[str]) -> dict[str, tuple[bool, str, str]]:
    return {
        row.url: (row.registered, row.status, row.model_id) for row in Worker.objects.filter(url__in=urls)
    }


@pytest.mark.django_db(transaction=True)
async def test_a_batch_with_a_stored_url_refuses_that_url_alone(quick_config, start_worker: WorkerFactory) -> None:
    first, taken, last = [await start_worker(model=name) for name in ("m-first", "m-taken", "m-last")]
    held = await asyncio.to_thread(create_worker, parse_worker_spec({"url": taken.url}))
    await asyncio.to_thread(wait_for_local_jobs)

    outcomes = await asyncio.to_thread(
        create_workers, [parse_worker_spec({"url": worker.url}) for worker in (first, taken, last)]
    )
    await asyncio.to_thread(wait_for_local_jobs)

    assert isinstance(outcomes[1], (WorkerAlreadyExists, WorkerCreateInProgress)), outcomes[1]
    assert str(held.pk) in str(outcomes[1])  # the refusal names the worker that holds the URL
    assert [type(outcome) for outcome in (outcomes[0], outcomes[2])] == [Worker, Worker]
    rows = await asyncio.to_thread(_registered, [first.url, taken.url, last.url])
    assert rows == {
        first.url: (True, WorkerStatus.READY, "m-first"),
        taken.url: (True, WorkerStatus.READY, "m-taken"),
        last.url: (True, WorkerStatus.READY, "m-last"),
    }
    assert await Worker.objects.filter(url=taken.url).acount() == 1
    assert (await Worker.objects.aget(url=taken.url)).pk == held.pk


@pytest.mark.django_db(transaction=True)
async def test_a_discovered_batch_registers_around_a_worker_it_cannot_register(
    quick_config, start_worker: WorkerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="administration.discovery_reconcile")
    caplog.set_level(logging.WARNING, logger="administration.registration")
    up = [await start_worker(model=f"m{index}") for index in range(3)]
    found = {f"d{index}": DiscoveredWorker(f"d{index}", worker.url) for index, worker in enumerate(up)}
    found["bad"] = DiscoveredWorker("bad", "ftp://10.0.0.9:8000")  # refused by the spec's rules
    silent = f"http://127.0.0.1:{free_port()}"  # nothing listens: its registration fails after the batch
    found["silent"] = DiscoveredWorker("silent", silent)

    result = await asyncio.to_thread(reconcile, "file", found)
    await asyncio.to_thread(wait_for_local_jobs, 60.0)

    assert (result.discovered, result.registered, result.failed) == (5, 4, 1)
    assert any("ftp://10.0.0.9:8000" in record.getMessage() for record in caplog.records)
    assert any(silent in record.getMessage() and "did not answer" in record.getMessage() for record in caplog.records)
    assert not await Worker.objects.filter(url=silent).aexists()  # released: the next pass tries it again
    rows = await asyncio.to_thread(_registered, [worker.url for worker in up])
    assert rows == {worker.url: (True, WorkerStatus.READY, f"m{index}") for index, worker in enumerate(up)}
    labels = [row.labels async for row in Worker.objects.filter(registered=True)]
    assert sorted(label[PROVIDER_LABEL] for label in labels) == ["file"] * 3
