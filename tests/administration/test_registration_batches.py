"""Registrations queued together run together (D97): a fleet's first registrations (--worker-urls,
file or Kubernetes discovery) share one read of their rows, one transaction for their results and
one write of their change-log rows, and the health transitions that pass together are written
together; each worker ends exactly as its own job would have ended it (registered with the same
fields, refused alone, waited for by its own job when it does not answer yet, dropped when a newer
job replaced it)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Iterator

import pytest
from django.utils import timezone

from administration import health, jobs
from administration.job_runner import run_job, run_registration_batch
from administration.models import JobState, JobType, RegistryChange, Worker, WorkerStatus
from administration.notices import Notice, add_local_listener, remove_local_listener
from common.config import GatewayConfig, install_config
from tests.conftest import WorkerFactory, free_port

pytestmark = pytest.mark.django_db(transaction=True)

_COMPARED = ("registered", "status", "runtime_type", "model_id", "labels", "model_cards", "provider_models",
             "job_state", "job_message", "last_error")


@pytest.fixture(autouse=True)
def quick_config() -> Iterator[None]:
    install_config(GatewayConfig(worker_startup_check_interval=0.1, worker_startup_timeout_secs=0.1), export=False)
    yield
    install_config(GatewayConfig(), export=False)


@pytest.fixture
def notices() -> Iterator[list[Notice]]:
    heard: list[Notice] = []
    add_local_listener(heard.append)
    yield heard
    remove_local_listener(heard.append)


def _queued_row(url: str) -> Worker:
    """A worker whose first registration is queued, as POST /workers and discovery store it."""
    return Worker.objects.create(
        url=url, status=WorkerStatus.PENDING, registered=False, job_type=JobType.ADD, job_state=JobState.PENDING,
        job_updated_at=timezone.now(), job_generation=1,
    )


def _fields(worker_id: Any) -> tuple[Any, ...]:
    row = Worker.objects.get(pk=worker_id)
    return tuple(getattr(row, name) for name in _COMPARED)


async def test_a_batch_registers_each_worker_as_its_own_job_would(
    start_worker: WorkerFactory, notices: list[Notice], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="administration")
    up = [await start_worker(model=f"m{index}") for index in range(3)]
    alone = await start_worker(model="m0")  # registered by its own job, to compare with
    refusing = await start_worker(model="locked", api_key="sk-its-own")  # 401 without it
    silent = f"http://127.0.0.1:{free_port()}"
    rows = [await asyncio.to_thread(_queued_row, url) for url in [*(w.url for w in up), refusing.url, silent]]
    reference = await asyncio.to_thread(_queued_row, alone.url)
    replaced = await asyncio.to_thread(_queued_row, (await start_worker(model="m-replaced")).url)
    await Worker.objects.filter(pk=replaced.pk).aupdate(job_generation=2)  # a newer job took it
    changes_before = await RegistryChange.objects.acount()

    batch = [(str(row.pk), 1) for row in [*rows, replaced]]
    left = await asyncio.to_thread(run_registration_batch, batch)
    await asyncio.to_thread(run_job, "register", str(reference.pk), 1)

    assert left == [(str(rows[4].pk), 1)]  # the silent one: its own job waits for it
    expected = await asyncio.to_thread(_fields, reference.pk)
    assert expected[:4] == (True, WorkerStatus.PENDING, "sglang", "m0")
    for index, row in enumerate(rows[:3]):  # the same as its own job's, but for its model's name
        fields = await asyncio.to_thread(_fields, row.pk)
        assert json.dumps(fields, default=str) == json.dumps(expected, default=str).replace('"m0"', f'"m{index}"')
    assert not await Worker.objects.filter(pk=rows[3].pk).aexists()  # refused: released, as its own job does
    assert any(refusing.url in record.getMessage() and "401" in record.getMessage() for record in caplog.records)
    still = await Worker.objects.aget(pk=rows[4].pk)
    assert (still.registered, still.job_state) == (False, JobState.PENDING)  # untouched until its own job runs
    replaced_row = await Worker.objects.aget(pk=replaced.pk)
    assert (replaced_row.registered, replaced_row.job_state) == (False, JobState.PENDING)
    # One change-log row and one numbered notice per worker registered (the refused one's release has its own).
    registered = {str(row.pk) for row in rows[:3]}
    heard = {notice.worker_id: notice.seq for notice in notices if notice.worker_id in registered}
    assert set(heard) == registered and all(seq is not None for seq in heard.values())
    logged = set(await asyncio.to_thread(lambda: [str(w) for w in RegistryChange.objects.values_list("worker_id", flat=True)]))
    assert registered <= logged
    assert await RegistryChange.objects.acount() == changes_before + 3 + 1 + 1  # the batch's, the release, the reference

    await asyncio.to_thread(run_job, "register", *left[0])  # its own job: waits, then gives up and releases it
    assert not await Worker.objects.filter(pk=rows[4].pk).aexists()


async def test_transitions_that_pass_together_are_written_together(notices: list[Notice]) -> None:
    rows = [await asyncio.to_thread(_queued_row, f"http://127.0.0.1:{9000 + index}") for index in range(4)]
    await Worker.objects.filter(pk__in=[row.pk for row in rows[:3]]).aupdate(registered=True)
    await Worker.objects.filter(pk=rows[2].pk).aupdate(status=WorkerStatus.READY)  # moved already
    ids = [str(row.pk) for row in rows]

    moved = await asyncio.to_thread(
        health.transitions, [(worker_id, WorkerStatus.PENDING, WorkerStatus.READY) for worker_id in ids]
    )

    assert moved == {(worker_id, "pending", "ready") for worker_id in ids[:2]}  # not the ready one, nor the unlisted
    statuses = {str(row.pk): row.status async for row in Worker.objects.filter(pk__in=ids)}
    assert statuses == {ids[0]: "ready", ids[1]: "ready", ids[2]: "ready", ids[3]: "pending"}
    heard = [notice for notice in notices if notice.worker_id in ids]
    assert {notice.worker_id for notice in heard} == set(ids[:2]) and all(notice.seq for notice in heard)


async def test_the_health_checker_writes_the_transitions_asked_together_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [await asyncio.to_thread(_queued_row, f"http://127.0.0.1:{9100 + index}") for index in range(3)]
    await Worker.objects.filter(pk__in=[row.pk for row in rows]).aupdate(registered=True)
    calls: list[int] = []
    real = health.transitions

    def counted(moves: list[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        calls.append(len(moves))
        return real(moves)

    monkeypatch.setattr(health, "transitions", counted)
    checker = health.HealthChecker(on_change=lambda worker_id, status: asyncio.sleep(0))
    try:
        answers = await asyncio.gather(
            *(checker._stored(str(row.pk), WorkerStatus.PENDING, WorkerStatus.READY) for row in rows),
            checker._stored(str(rows[0].pk), WorkerStatus.NOT_READY, WorkerStatus.READY),
        )
    finally:
        await checker.aclose()

    assert answers == [True, True, True, False]
    assert calls == [4]


def test_registrations_queued_together_are_taken_together(monkeypatch: pytest.MonkeyPatch) -> None:
    submitted: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
    batches: list[list[tuple[str, int]]] = []
    monkeypatch.setattr(jobs, "_submit", lambda func, *args: submitted.append((func, args)))
    monkeypatch.setattr(jobs, "_registrations", [])
    monkeypatch.setattr(jobs, "_taker_queued", False)
    monkeypatch.setattr(jobs, "REGISTRATION_BATCH", 3)

    def batch_run(batch: list[tuple[str, int]]) -> list[tuple[str, int]]:
        batches.append(batch)
        return batch[:1]

    monkeypatch.setattr(jobs, "run_registration_batch", batch_run)

    for index in range(4):
        jobs._submit_local("register", (f"w{index}", 1))
    jobs._submit_local("update", ("w9", 1, {}))

    assert [func for func, _ in submitted] == [jobs._take_registrations, jobs.run_job]  # one taker for all four
    submitted[0][0]()  # takes three, queues a taker for the fourth, leaves w0 to its own job
    assert batches == [[("w0", 1), ("w1", 1), ("w2", 1)]]
    assert [(func, args) for func, args in submitted[2:]] == [
        (jobs._take_registrations, ()), (jobs.run_job, ("register", "w0", 1)),
    ]
    ran: list[tuple[Any, ...]] = []
    monkeypatch.setattr(jobs, "run_job", lambda *args: ran.append(args))
    submitted[2][0]()  # one alone (a POST's) runs as its own job
    assert ran == [("register", "w3", 1)] and batches == [batches[0]]


class _Clock:
    """jobs.py's clock: monotonic() as set, sleep() recorded (and ``during_sleep`` run in it)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.during_sleep: Callable[[], None] = lambda: None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, secs: float) -> None:
        self.slept.append(secs)
        self.during_sleep()


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> tuple[_Clock, list[Any], list[list[tuple[str, int]]], list[Any]]:
    """jobs.py's registration queue emptied, its clock, what it submits, the batches and the jobs run alone."""
    clock = _Clock()
    submitted: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
    batches: list[list[tuple[str, int]]] = []
    ran: list[tuple[Any, ...]] = []
    monkeypatch.setattr(jobs, "time", clock)
    monkeypatch.setattr(jobs, "_submit", lambda func, *args: submitted.append((func, args)))
    monkeypatch.setattr(jobs, "_registrations", [])
    monkeypatch.setattr(jobs, "_taker_queued", False)
    monkeypatch.setattr(jobs, "_last_queued", float("-inf"))
    monkeypatch.setattr(jobs, "_burst", False)
    monkeypatch.setattr(jobs, "run_registration_batch", lambda batch: batches.append(batch) or [])
    monkeypatch.setattr(jobs, "run_job", lambda *args: ran.append(args))
    return clock, submitted, batches, ran


def test_a_registration_queued_alone_runs_at_once(queue: tuple[_Clock, list[Any], list[Any], list[Any]]) -> None:
    clock, submitted, batches, ran = queue
    jobs._submit_local("register", ("w0", 1))
    clock.now += 5 * jobs.REGISTRATION_BURST_SECS  # the next POST comes well after
    submitted[0][0]()
    jobs._submit_local("register", ("w1", 1))
    submitted[1][0]()

    assert clock.slept == [] and batches == []
    assert ran == [("register", "w0", 1), ("register", "w1", 1)]


def test_registrations_posted_one_after_another_are_taken_together(
    queue: tuple[_Clock, list[Any], list[Any], list[Any]],
) -> None:
    clock, submitted, batches, ran = queue
    jobs._submit_local("register", ("w0", 1))
    submitted[0][0]()  # the first of the burst, alone: at once
    clock.now += jobs.REGISTRATION_BURST_SECS / 4
    jobs._submit_local("register", ("w1", 1))  # the next soon after: its taker waits for the rest

    def more_posts() -> None:
        for index in (2, 3):
            clock.now += jobs.REGISTRATION_BURST_SECS / 4
            jobs._submit_local("register", (f"w{index}", 1))

    clock.during_sleep = more_posts
    submitted[1][0]()

    assert clock.slept == [jobs.REGISTRATION_LINGER_SECS]
    assert ran == [("register", "w0", 1)]
    assert batches == [[("w1", 1), ("w2", 1), ("w3", 1)]]
    assert len(submitted) == 2  # the POSTs during the wait queued no taker of their own
    jobs._submit_local("update", ("w9", 1, {}))  # other jobs never wait
    assert submitted[2][1] == ("update", "w9", 1, {})


async def test_first_health_probes_are_spread_only_when_loops_start_together() -> None:
    checker = health.HealthChecker(on_change=lambda worker_id, status: asyncio.sleep(0))
    try:
        alone = checker._first_delay(1.0)  # a worker just registered: probed at once
        fleet = [checker._first_delay(1.0) for _ in range(1500)]  # a fleet's loops started together
    finally:
        await checker.aclose()

    assert alone <= 2 / health._FIRST_PROBES_PER_SEC
    spread = fleet[: int(health._FIRST_PROBES_PER_SEC) - 2]
    assert spread == sorted(spread) and spread[-1] > 0.9  # one after another over the whole window
    assert all(0.0 <= delay <= 1.0 for delay in fleet)  # the rest at random points of it
    assert len({round(delay, 1) for delay in fleet[-400:]}) > 5
