"""A first registration whose job is gone (its process died, the broker lost it, it gave up on the
store) no longer keeps its URL from being registered: past the longest a job could still be running,
the next POST of the URL replaces it; before that the spec's 409 WORKER_CREATE_IN_PROGRESS stands."""

from __future__ import annotations

from datetime import timedelta
from typing import Iterator

import pytest
from django.test import Client
from django.utils import timezone

from administration.models import JobState, JobType, Worker, WorkerStatus
from administration.registration import JOB_STORE_PATIENCE_SECS
from administration.workers import ABANDONED_SLACK
from common.config import GatewayConfig, install_config

pytestmark = pytest.mark.django_db  # in a test transaction: no job is started by the POSTs

CONFIG = GatewayConfig(worker_startup_timeout_secs=60.0)
LONGEST_JOB = timedelta(seconds=CONFIG.worker_startup_timeout_secs + JOB_STORE_PATIENCE_SECS) + ABANDONED_SLACK


@pytest.fixture(autouse=True)
def config() -> Iterator[None]:
    install_config(CONFIG, export=False)
    yield
    install_config(GatewayConfig(), export=False)


def _pending(url: str, moved_ago: timedelta) -> Worker:
    return Worker.objects.create(
        url=url, status=WorkerStatus.PENDING, registered=False, job_type=JobType.ADD, job_state=JobState.PENDING,
        job_updated_at=timezone.now() - moved_ago, job_generation=1,
    )


def test_a_registration_whose_job_is_gone_no_longer_blocks_its_url(client: Client) -> None:
    running = _pending("http://127.0.0.1:9", LONGEST_JOB - timedelta(minutes=1))
    gone = _pending("http://127.0.0.1:10", LONGEST_JOB + timedelta(seconds=5))

    busy = client.post("/workers", {"url": running.url}, content_type="application/json")
    assert busy.status_code == 409 and busy.json()["code"] == "WORKER_CREATE_IN_PROGRESS"

    again = client.post("/workers", {"url": gone.url}, content_type="application/json")
    assert again.status_code == 202, again.content
    assert again.json()["worker_id"] != str(gone.pk)
    assert not Worker.objects.filter(pk=gone.pk).exists()
    assert Worker.objects.get(url=gone.url).job_state == JobState.PENDING  # the new registration's
    assert Worker.objects.filter(pk=running.pk).exists()
