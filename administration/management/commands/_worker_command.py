"""What the worker commands share: finding a worker and waiting for its job."""

from __future__ import annotations

import time

from django.core.management.base import CommandError

from administration.jobs import wait_for_local_jobs
from administration.models import Worker
from administration.workers import WorkerError, find_worker

__all__ = ["resolve", "wait_for_job"]


def resolve(ref: str) -> Worker:
    try:
        return find_worker(ref)
    except WorkerError as exc:
        raise CommandError(str(exc)) from None


def wait_for_job(worker: Worker, timeout: float) -> Worker | None:
    """Wait for the worker's job (in-process jobs run in this command; Celery jobs elsewhere).
    Returns the worker as stored afterwards, or None when it is gone."""
    wait_for_local_jobs(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = Worker.objects.filter(pk=worker.pk).first()
        if current is None or current.job_state in ("", "failed"):
            return current
        time.sleep(0.2)
    raise CommandError(f"the job on {worker.url} did not finish within {timeout:g} s")
