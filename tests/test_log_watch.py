"""The check that fails a test whose run logged an unhandled exception: what it counts and what it
lets pass."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from inference.escapes import log_escape
from tests.log_watch import escape_lines, is_escape, watching_escapes


def _record(name: str, message: str, level: int = logging.ERROR, exc: bool = False) -> logging.LogRecord:
    exc_info = (RuntimeError, RuntimeError("x"), None) if exc else None
    return logging.LogRecord(name, level, __file__, 1, message, (), exc_info)


@pytest.mark.parametrize(
    ("record", "counted"),
    [
        (_record("inference.escapes", "unhandled exception on GET / (request r)", exc=True), True),
        (_record("django.request", "Internal Server Error: /workers", exc=True), True),
        (_record("django.request", "Service Unavailable: /workers"), False),  # a 503 the view chose
        (_record("django.request", "Unprocessable Entity: /workers", logging.WARNING), False),
        (_record("uvicorn.error", "Exception in ASGI application\n", exc=True), True),
        (_record("daphne.server", "Exception inside application: boom", exc=True), True),
        (_record("asyncio", "Task exception was never retrieved"), True),
        (_record("administration.loads", "load poll failed", exc=True), False),  # caught and logged on purpose
        (_record("inference.escapes", "unhandled exception on GET /", logging.WARNING), False),
    ],
)
def test_what_counts_as_an_unhandled_exception(record: logging.LogRecord, counted: bool) -> None:
    assert is_escape(record) is counted


@pytest.mark.escapes_expected
def test_the_watch_sees_the_gateways_escape_records_and_asyncios() -> None:
    with watching_escapes() as watch:
        log_escape("GET", "/x", "rid", RuntimeError("boom"))

        async def fails() -> None:
            raise RuntimeError("never retrieved")

        async def leave_a_failed_task() -> None:
            asyncio.ensure_future(fails())
            await asyncio.sleep(0)

        asyncio.run(leave_a_failed_task())
        gc.collect()
        logging.getLogger("administration.loads").exception("load poll failed")
    messages = [record.getMessage() for record in watch.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("unhandled exception on GET /x (request rid)")
    assert messages[1].startswith("Task exception was never retrieved")


def test_escape_lines_of_a_process_log() -> None:
    log = "\n".join([
        "2026-01-01 INFO inference started",
        "2026-01-01 ERROR uvicorn.error Exception in ASGI application",
        "Traceback (most recent call last):",
        "2026-01-01 ERROR inference.escapes unhandled exception on POST /v1/chat/completions (request r)",
        "2026-01-01 ERROR administration.loads load poll failed",
    ])
    assert escape_lines(log) == [log.splitlines()[1], log.splitlines()[3]]
