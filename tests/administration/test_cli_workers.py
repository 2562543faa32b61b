"""--worker-urls and a shared store: which stored command-line workers a starting gateway keeps,
registers anew or removes (administration.workers.sync_cli_workers)."""

from __future__ import annotations

import pytest

from administration.models import JobType, Worker, WorkerSource, WorkerStatus
from administration.workers import sync_cli_workers

pytestmark = pytest.mark.django_db


def stored(url: str, *, source: str = WorkerSource.CLI, status: str = WorkerStatus.READY) -> Worker:
    return Worker.objects.create(url=url, source=source, status=status, registered=True, job_generation=1)


def test_listed_urls_become_pending_command_line_workers(django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks() as queued:
        sync_cli_workers(["http://a:1", "http://b:1"])
    workers = {w.url: w for w in Worker.objects.all()}
    assert set(workers) == {"http://a:1", "http://b:1"}
    assert all(w.source == WorkerSource.CLI and w.status == WorkerStatus.PENDING for w in workers.values())
    assert len(queued) == 2  # one registration job each


def test_a_gateway_without_worker_urls_leaves_the_stored_fleet_alone(django_capture_on_commit_callbacks) -> None:
    first = stored("http://a:1")
    lagging = stored("http://b:1", status=WorkerStatus.NOT_READY)
    with django_capture_on_commit_callbacks() as queued:
        kept = sync_cli_workers([])
    assert {w.pk for w in kept} == {first.pk, lagging.pk}
    assert not queued
    first.refresh_from_db()
    assert first.status == WorkerStatus.READY


def test_a_ready_listed_worker_keeps_serving_and_a_lagging_one_registers_anew(
    django_capture_on_commit_callbacks,
) -> None:
    ready = stored("http://a:1")
    lagging = stored("http://b:1", status=WorkerStatus.NOT_READY)
    with django_capture_on_commit_callbacks() as queued:
        sync_cli_workers(["http://a:1", "http://b:1"])
    ready.refresh_from_db()
    lagging.refresh_from_db()
    assert ready.status == WorkerStatus.READY and ready.job_generation == 1
    assert lagging.status == WorkerStatus.PENDING and lagging.job_type == JobType.ADD and lagging.job_generation == 2
    assert len(queued) == 1


def test_the_flag_list_removes_unlisted_command_line_workers_but_not_api_ones() -> None:
    stored("http://old:1")
    api = stored("http://api:1", source=WorkerSource.API)
    sync_cli_workers(["http://api:1"])  # names an API worker: it stays an API worker
    assert list(Worker.objects.values_list("url", "source")) == [(api.url, WorkerSource.API)]
