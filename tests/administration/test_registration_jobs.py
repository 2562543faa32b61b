"""Job bodies: stale jobs never overwrite newer state; update merge rules; removal."""

from __future__ import annotations

import pytest

from administration.models import JobState, Worker, WorkerStatus
from administration.registration import run_registration, run_removal, run_update

pytestmark = pytest.mark.django_db


def make_worker(**fields) -> Worker:
    defaults = dict(url="http://w:1", registered=True, status=WorkerStatus.READY, job_generation=3, job_state=JobState.PENDING)
    return Worker.objects.create(**{**defaults, **fields})


def test_stale_update_is_dropped() -> None:
    worker = make_worker(priority=10)
    run_update(str(worker.pk), 2, {"priority": 99})  # queued before a newer job (generation 3)
    worker.refresh_from_db()
    assert worker.priority == 10 and worker.job_state == JobState.PENDING


def test_stale_removal_is_dropped() -> None:
    worker = make_worker()
    run_removal(str(worker.pk), 1)
    assert Worker.objects.filter(pk=worker.pk).exists()


def test_stale_registration_is_dropped() -> None:
    worker = make_worker(status=WorkerStatus.NOT_READY)
    run_registration(str(worker.pk), 1)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.NOT_READY


def test_update_merges_labels_and_blocks() -> None:
    worker = make_worker(labels={"a": "1", "b": "2"}, settings={"health": {"timeout_secs": 5, "failure_threshold": 3}})
    run_update(str(worker.pk), 3, {"labels": {"b": "x"}, "health": {"timeout_secs": 9}, "models": [{"id": "m2"}]})
    worker.refresh_from_db()
    assert worker.labels == {"a": "1", "b": "x"}
    assert worker.settings["health"] == {"timeout_secs": 9, "failure_threshold": 3}
    assert worker.model_id == "m2" and worker.job_state == JobState.NONE


def test_removal_of_a_not_ready_worker_is_immediate() -> None:
    worker = make_worker(status=WorkerStatus.NOT_READY)
    run_removal(str(worker.pk), 3)
    assert not Worker.objects.filter(pk=worker.pk).exists()
