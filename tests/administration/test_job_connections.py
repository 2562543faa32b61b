"""A local job thread keeps its SQLite connection for its next job (common/db.py
release_connections): opening the store's file again parses its schema, about a millisecond of CPU
per registration while a fleet registers. A pooled store's connections still go back after each job,
and a SQLite connection that saw a database error is still closed. POST /workers does its store work
on such a thread too (common/db.py on_store_thread): Django's ASGI handler gives each
request a thread of its own."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.test import Client
from django.utils import timezone

from common import db
from common.db import release_connections
from administration.job_runner import run_job
from administration.jobs import wait_for_local_jobs
from administration.models import JobState, JobType, Worker, WorkerStatus
from tests.administration.job_fixtures import jobs_end_at_once  # noqa: F401 (autouse here)

pytestmark = pytest.mark.django_db(transaction=True)


def _in_a_thread(work: Callable[[], Any]) -> Any:
    """Run ``work`` on a thread of its own (a job thread's connection is that thread's), closing the
    thread's connection at the end."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(work())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return result[0]


def _registered_worker(url: str) -> Worker:
    return Worker.objects.create(
        url=url, status=WorkerStatus.READY, registered=True, job_type=JobType.UPDATE, job_state=JobState.PENDING,
        job_updated_at=timezone.now(), job_generation=1,
    )


def test_a_job_thread_keeps_its_sqlite_connection_between_jobs() -> None:
    first, second = _registered_worker("http://127.0.0.1:9"), _registered_worker("http://127.0.0.1:10")

    def two_jobs() -> tuple[Any, Any]:
        run_job("update", str(first.pk), 1, {"priority": 3})
        after_first = connection.connection
        run_job("update", str(second.pk), 1, {"priority": 4})
        return after_first, connection.connection

    after_first, after_second = _in_a_thread(two_jobs)
    assert Worker.objects.get(pk=first.pk).priority == 3 and Worker.objects.get(pk=second.pk).priority == 4
    if connection.vendor == "sqlite":
        assert after_first is not None and after_second is after_first
    else:  # a pooled store: back to the pool after each job
        assert after_first is None and after_second is None


@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_a_sqlite_connection_that_saw_an_error_is_still_closed() -> None:
    def failed() -> Any:
        connection.ensure_connection()
        connection.errors_occurred = True  # what Django marks after a database error on it
        release_connections()
        return connection.connection

    assert _in_a_thread(failed) is None


@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_posts_from_threads_of_their_own_open_the_store_once() -> None:
    opened: list[str] = []  # the threads that opened the store, but for job threads (the tests above)

    def count(sender: Any, connection: Any, **_: Any) -> None:
        if not threading.current_thread().name.startswith("gateway-job"):
            opened.append(threading.current_thread().name)

    def post(port: int) -> int:
        return Client().post("/workers", {"url": f"http://127.0.0.1:{port}"}, content_type="application/json").status_code

    connection_created.connect(count)
    try:
        assert _in_a_thread(lambda: post(9)) == 202
        wait_for_local_jobs()
        opened.clear()
        assert _in_a_thread(lambda: post(10)) == 202  # a request's thread of its own, as under ASGI
        wait_for_local_jobs()
    finally:
        connection_created.disconnect(count)
    assert opened == []


def test_first_posts_arriving_together_share_one_store_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two first POSTs on threads of their own make one pool between them: the pool is made under a
    lock (a second one would keep its own threads and connections for the process's life)."""
    monkeypatch.setattr(db, "_store_pool", [])
    made: list[object] = []
    real = db.ThreadPoolExecutor

    class SlowPool(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            time.sleep(0.05)  # widens the window in which a second thread could make its own
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(db, "ThreadPoolExecutor", SlowPool)
    pools: list[object] = []
    threads = [threading.Thread(target=lambda: pools.append(db._store_threads())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1
    assert len(pools) == 8 and all(pool is made[0] for pool in pools)
    made[0].shutdown()  # type: ignore[attr-defined]
