"""Run a control-plane job: on Celery when a broker is configured, else on a background thread of
this process, with the same code. Enqueue after the transaction that wrote the row commits.

A job the broker does not take (down, refusing, not answering within the send timeout of
CELERY_BROKER_CONNECTION_TIMEOUT and CELERY_TASK_PUBLISH_RETRY_POLICY) runs on this process's
threads instead, so the row it was queued for never waits on a job that was lost. The outage is
logged once each way (:data:`common.outages.BROKER`); while it lasts the broker is tried again
every ``BROKER.retry_secs`` and the jobs in between run here at once."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerUnavailable

from administration.job_runner import JOBS, run_job
from administration.tasks import run_job_task
from common.outages import BROKER

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
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}")

    def submit() -> None:
        if settings.CELERY_BROKER_URL and not local and BROKER.retry_due() and _sent(name, args):
            return
        _submit_local(name, args)

    transaction.on_commit(submit)


def _sent(name: str, args: tuple[Any, ...]) -> bool:
    """Hand the job to the broker; False when it did not take it (the caller runs it here)."""
    try:
        run_job_task.delay(name, *args)
    except (BrokerUnavailable, OSError) as exc:
        BROKER.failed(exc)
        return False
    except Exception:
        log.exception("could not send job %s%s to the broker; running it in this process", name, args[:1])
        return False
    BROKER.recovered()
    return True


def wait_for_local_jobs(timeout: float = 30.0) -> None:
    """Block until the in-process jobs queued so far finish (tests, commands)."""
    for future in list(_pending):
        future.result(timeout=timeout)
