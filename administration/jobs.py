"""Run a control-plane job: on Celery when a broker is configured, else on a background thread of
this process, with the same code. Enqueue after the transaction that wrote the row commits."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.db import transaction

from administration.registration import JOB_FUNCTIONS, run_job
from administration.tasks import run_job_task

__all__ = ["enqueue", "wait_for_local_jobs"]

log = logging.getLogger(__name__)

_executor: ThreadPoolExecutor | None = None
_pending: list[Any] = []


def _submit_local(name: str, args: tuple[Any, ...]) -> None:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="gateway-job")
    _pending.append(_executor.submit(run_job, name, *args))
    _pending[:] = [future for future in _pending if not future.done()]


def enqueue(name: str, *args: Any, local: bool = False) -> None:
    """Queue job ``name`` once the current transaction commits (at once outside one).

    ``local`` runs it in this process even when a broker is configured (the gateway's own
    --worker-urls, which must come up without a Celery worker).
    """
    if name not in JOB_FUNCTIONS:
        raise ValueError(f"unknown job {name!r}")

    def submit() -> None:
        if settings.CELERY_BROKER_URL and not local:
            run_job_task.delay(name, *args)
        else:
            _submit_local(name, args)

    transaction.on_commit(submit)


def wait_for_local_jobs(timeout: float = 30.0) -> None:
    """Block until the in-process jobs queued so far finish (tests, commands)."""
    for future in list(_pending):
        future.result(timeout=timeout)
