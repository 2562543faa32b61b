"""No job dies half-way (issue 22, item 2): whatever fails in any step of a job, in a step that ran
outside the job's own error handling before, ends the job as failed through the one runner
(administration/job_runner.py), visible to the caller, and frees the URL or the name.

The failures are real, provoked by rows as the store can hold them (written by an earlier release,
or straight into the store), never by a replaced function: a worker key that cannot be sent as a
header (httpx's UnicodeEncodeError while the probe's request is built), a tokenizer source whose
file name is too long (OSError from the first look at the path, before the load's own handling),
an update whose changes are not what the API sends (TypeError)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from administration.job_runner import JOBS, run_job
from administration.models import JobState, JobType, RegisteredTokenizer, TokenizerStatus, Worker, WorkerStatus
from administration.tokenizer_jobs import ABANDONED_AFTER, clock
from tests.administration.job_fixtures import jobs_end_at_once  # noqa: F401 (autouse here)

pytestmark = pytest.mark.django_db(transaction=True)

URL = "http://127.0.0.1:9"  # never reached by the jobs under test: each fails before it connects


def _stored_worker(*, registered: bool, api_key: str = "", job_type: str = JobType.ADD) -> Worker:
    return Worker.objects.create(
        url=URL, api_key=api_key, status=WorkerStatus.READY if registered else WorkerStatus.PENDING,
        registered=registered, job_type=job_type, job_state=JobState.PENDING, job_updated_at=timezone.now(),
        job_generation=1,
    )


def test_every_job_has_a_way_to_end_failed() -> None:
    assert set(JOBS) == {"register", "update", "remove", "load_tokenizer"}
    assert all(callable(job.fail) and job.keys >= 1 for job in JOBS.values())


def test_a_first_registration_that_crashes_releases_its_id_and_url(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="administration")
    worker = _stored_worker(registered=False, api_key="sk-clé")
    run_job("register", str(worker.pk), 1)
    assert client.get(f"/workers/{worker.pk}").status_code == 404  # the spec's release of a failed first job
    assert any("UnicodeEncodeError" in record.getMessage() for record in caplog.records)
    again = client.post("/workers", {"url": URL}, content_type="application/json")
    assert again.status_code == 202, again.content  # not 409 WORKER_CREATE_IN_PROGRESS: the URL is free


def test_a_registered_workers_crashed_job_is_failed_and_shown() -> None:
    worker = _stored_worker(registered=True, api_key="sk-clé")
    run_job("register", str(worker.pk), 1)
    body = Client().get(f"/workers/{worker.pk}").json()
    assert body["job_status"]["status"] == "failed" and body["job_status"]["job_type"] == "AddWorker"
    assert "UnicodeEncodeError" in body["job_status"]["message"] and "clé" not in body["job_status"]["message"]


def test_an_update_that_crashes_is_failed_and_changes_nothing() -> None:
    worker = _stored_worker(registered=True, job_type=JobType.UPDATE)
    run_job("update", str(worker.pk), 1, {"labels": ["not", "an", "object"], "priority": 7})
    worker.refresh_from_db()
    assert worker.job_state == JobState.FAILED and "TypeError" in worker.job_message
    assert worker.priority == 50


def test_a_stale_failure_does_not_touch_a_newer_job() -> None:
    worker = _stored_worker(registered=False, api_key="sk-clé")
    Worker.objects.filter(pk=worker.pk).update(job_generation=2)  # replaced since this job was queued
    run_job("register", str(worker.pk), 1)
    worker.refresh_from_db()
    assert worker.job_state == JobState.PENDING and worker.job_generation == 2


def test_a_tokenizer_load_that_crashes_outside_its_handling_is_failed_and_frees_the_name(client: Client) -> None:
    row = RegisteredTokenizer.objects.create(name="long", source="a" * 300, updated_at=clock())
    run_job("load_tokenizer", str(row.pk))
    status = client.get(f"/v1/tokenizers/{row.pk}/status").json()
    assert status["status"] == "failed" and "OSError" in status["message"]
    again = client.post("/v1/tokenizers", {"name": "long", "source": "/nonexistent/a"}, content_type="application/json")
    assert again.status_code == 202, again.content  # not 409: a failed load holds no name


def test_a_tokenizer_load_that_fails_keeps_its_reason() -> None:
    row = RegisteredTokenizer.objects.create(name="missing", source="/nonexistent/tokenizer", updated_at=clock())
    run_job("load_tokenizer", str(row.pk))
    row.refresh_from_db()
    assert row.status == TokenizerStatus.FAILED and "no tokenizer.json" in row.message


def test_a_tokenizer_load_whose_job_is_gone_is_failed_and_frees_the_name(client: Client) -> None:
    """A load whose process died holds no name for ever: past ABANDONED_AFTER without progress it is failed."""
    busy = RegisteredTokenizer.objects.create(
        name="busy", source="/x", status=TokenizerStatus.PROCESSING, updated_at=clock() - ABANDONED_AFTER / 2
    )
    gone = RegisteredTokenizer.objects.create(
        name="gone", source="/x", status=TokenizerStatus.PROCESSING, updated_at=clock() - ABANDONED_AFTER - timedelta(seconds=1)
    )
    held = client.post("/v1/tokenizers", {"name": "busy", "source": "/nonexistent/a"}, content_type="application/json")
    assert held.status_code == 409 and held.json()["id"] == str(busy.pk)  # its job may still be loading
    freed = client.post("/v1/tokenizers", {"name": "gone", "source": "/nonexistent/a"}, content_type="application/json")
    assert freed.status_code == 202, freed.content
    status = client.get(f"/v1/tokenizers/{gone.pk}/status").json()
    assert status["status"] == "failed" and "ended without a result" in status["message"]
