"""How a control-plane job runs (in a Celery task or on a local job thread, administration/jobs.py):
the jobs by name, each with the way it ends as failed, and :func:`run_job`, the one wrapper every
job runs inside.

Any failure of any step of a job, expected (a worker that refuses, a tokenizer that does not load)
or not (a bug, a library raising what it never documented), ends the job as failed: the job's own
``fail`` writes it (a first registration releases its id and URL, a later worker job keeps a failed
job_status, a tokenizer load is failed, which frees its name), so nothing is left pending or
processing for a caller to wait on. Each ``fail`` is conditional like the job's own writes (on the
worker's job generation, on the tokenizer's status), so it never overwrites a newer job's state.

A job the store fails (an outage, logged once) runs again from its start once the store is back,
for up to JOB_STORE_PATIENCE_SECS: every job is safe to repeat, since each of its writes is
conditional. A job given up then leaves its row as it was; a first registration's row is released
by the next POST of its URL (administration/workers.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from common.db import STORE_ERRORS, release_connections
from administration.registration import (
    JOB_STORE_PATIENCE_SECS,
    RegistrationFailed,
    fail_registration,
    fail_worker_job,
    run_registration,
    run_registrations,
    run_removal,
    run_update,
)
from administration.tokenizer_jobs import fail_tokenizer_load, run_tokenizer_load
from common.outages import STORE
from inference.pipeline.tokenizers import TokenizerLoadError

__all__ = ["Job", "JOBS", "run_job", "run_registration_batch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Job:
    """A job: ``run(*args)``; after any failure, ``fail(*args[:keys], message)`` ends it as failed
    (its first ``keys`` arguments name its row: a worker and its job generation, or a tokenizer)."""

    run: Callable[..., None]
    fail: Callable[..., None]
    keys: int


# The jobs by name: what jobs.enqueue queues and run_job runs.
JOBS: dict[str, Job] = {
    "register": Job(run_registration, fail_registration, keys=2),
    "update": Job(run_update, fail_worker_job, keys=2),
    "remove": Job(run_removal, fail_worker_job, keys=2),
    "load_tokenizer": Job(run_tokenizer_load, fail_tokenizer_load, keys=1),  # administration/tokenizer_jobs.py
}

# Failures a job names itself (its message is the reason); any other is a defect, logged with its trace.
_EXPECTED = (RegistrationFailed, TokenizerLoadError)


def run_job(name: str, *args: Any) -> None:
    """Run job ``name`` in this thread; whatever fails, the job ends (done, failed, or given up on
    a store outage)."""
    job = JOBS[name]
    deadline = time.monotonic() + JOB_STORE_PATIENCE_SECS
    while True:
        release_connections()
        try:
            job.run(*args)
        except STORE_ERRORS as exc:
            STORE.failed(exc)
            if time.monotonic() + STORE.retry_secs > deadline:
                log.error("job %s%s given up: the store was unavailable for %g s", name, args[:1],
                          JOB_STORE_PATIENCE_SECS)
                return
        except Exception as exc:
            _end_failed(job, name, args, _failure(name, args, exc))
            return
        else:
            STORE.recovered()
            return
        finally:
            release_connections()
        time.sleep(STORE.retry_secs)


def _failure(name: str, args: tuple[Any, ...], exc: Exception) -> str:
    """What a job's failure records: the reason a failure it names gives, else (a defect, logged
    with its trace) that the job failed."""
    if isinstance(exc, _EXPECTED):
        return str(exc) or type(exc).__name__
    log.error("job %s%s failed", name, args[:1], exc_info=exc)
    return f"the job failed ({type(exc).__name__}); see the gateway log"


def run_registration_batch(jobs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Run many ``register`` jobs together (administration/registration.py ``run_registrations``):
    each one that fails ends failed as its own job would; returns those to run one by one with
    :func:`run_job` (a worker that has not answered yet, one that is not a relayed worker, and all
    of them when the store fails the batch: each then waits out the outage on its own)."""
    job = JOBS["register"]
    release_connections()
    try:
        alone, failed = run_registrations(jobs)
    except STORE_ERRORS as exc:
        STORE.failed(exc)
        return jobs
    except Exception:
        log.exception("registrations of %d workers together failed; running them one by one", len(jobs))
        return jobs
    finally:
        release_connections()
    STORE.recovered()
    for args, error in failed:
        _end_failed(job, "register", args, _failure("register", args, error))
    return alone


def _end_failed(job: Job, name: str, args: tuple[Any, ...], message: str) -> None:
    """Record the job as failed; a store that fails this write too leaves the row to the timeouts
    that release abandoned jobs (logged)."""
    try:
        job.fail(*args[: job.keys], message)
    except Exception:
        log.exception("job %s%s could not be recorded as failed", name, args[:1])
    finally:
        release_connections()
