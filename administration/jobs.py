"""Run a control-plane job: on Celery when a broker is configured, else on a background thread of
this process, with the same code. Enqueue after the transaction that wrote the row commits.

A job the broker does not take (down, refusing, not answering within the send timeout of
CELERY_BROKER_CONNECTION_TIMEOUT and CELERY_TASK_PUBLISH_RETRY_POLICY) runs on this process's
threads instead, so the row it was queued for never waits on a job that was lost. The outage is
logged once each way (:data:`common.outages.BROKER`); while it lasts the broker is tried again
every ``BROKER.retry_secs`` and the jobs in between run here at once."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from django.conf import settings
from django.db import transaction

from administration.job_runner import JOBS, run_job, run_registration_batch
from common.outages import BROKER

__all__ = ["enqueue", "wait_for_local_jobs"]

log = logging.getLogger(__name__)

REGISTRATION_BATCH = 100  # first registrations queued together run together, this many at most
# A registration queued within REGISTRATION_BURST_SECS of the one before (POSTs one after another, a
# fleet registered by a script) is taken REGISTRATION_LINGER_SECS later, with those queued meanwhile:
# a burst of POSTs runs in batches as a fleet from --worker-urls does. One queued alone runs at once.
REGISTRATION_BURST_SECS = 0.1
REGISTRATION_LINGER_SECS = 0.1

_executor: ThreadPoolExecutor | None = None
_pending: list[Any] = []
_lock = threading.Lock()
_registrations: list[tuple[Any, ...]] = []  # registrations queued here that no job thread has taken yet
_taker_queued = False  # whether a job thread is due to take them
_last_queued = float("-inf")  # when the newest registration was queued (time.monotonic)
_burst = False  # whether it came within REGISTRATION_BURST_SECS of the one before


def _submit(func: Callable[..., None], *args: Any) -> None:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="gateway-job")
        _pending.append(_executor.submit(func, *args))
        _pending[:] = [future for future in _pending if not future.done()]


def _submit_local(name: str, args: tuple[Any, ...]) -> None:
    """Run the job on a local job thread. Registrations queued while none is free to take them (a
    fleet from --worker-urls or discovery, queued as its rows commit) are taken together, up to
    REGISTRATION_BATCH at once (job_runner.run_registration_batch); one queued alone (a POST) runs
    as its own job, as every job did; one queued in a burst (within REGISTRATION_BURST_SECS of the
    one before: POSTs one after another) is taken REGISTRATION_LINGER_SECS later with those queued
    meanwhile."""
    global _taker_queued, _last_queued, _burst
    if name != "register":
        _submit(run_job, name, *args)
        return
    with _lock:
        _registrations.append(args)
        now = time.monotonic()
        _burst, _last_queued = now - _last_queued < REGISTRATION_BURST_SECS, now
        if _taker_queued:
            return
        _taker_queued = True
    _submit(_take_registrations)


def _take_registrations() -> None:
    global _taker_queued
    with _lock:
        linger = _burst and len(_registrations) < REGISTRATION_BATCH
    if linger:  # more of the burst are on their way: take them together
        time.sleep(REGISTRATION_LINGER_SECS)
    with _lock:
        taken = _registrations[:REGISTRATION_BATCH]
        del _registrations[:REGISTRATION_BATCH]
        _taker_queued = bool(_registrations)
    if _taker_queued:  # the rest on another thread meanwhile
        _submit(_take_registrations)
    if len(taken) == 1:
        run_job("register", *taken[0])
        return
    for args in run_registration_batch([(str(worker_id), int(generation)) for worker_id, generation in taken]):
        _submit(run_job, "register", *args)


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
    # Celery is imported by a gateway that has a broker, at its first job sent (D118)
    from kombu.exceptions import OperationalError as BrokerUnavailable

    from administration.tasks import run_job_task

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
    while True:  # a job may queue others (a batch of registrations, those it leaves to their own jobs)
        with _lock:
            futures = [future for future in _pending if not future.done()]
        if not futures:
            return
        for future in futures:
            future.result(timeout=timeout)
