"""An outage of a service the gateway depends on is logged once when it starts and once when it
ends, however many calls run into it, and its log line never shows a URL's credentials."""

from __future__ import annotations

import logging

import pytest

from common.outages import Outage, describe


def test_an_outage_is_logged_once_each_way(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="common.outages")
    outage = Outage("the thing", "work goes elsewhere", retry_secs=60.0)
    outage.recovered()  # up: nothing to say
    assert not outage.down and outage.retry_due()
    for attempt in range(50):
        outage.failed(ConnectionRefusedError(111, f"Connection refused (attempt {attempt})"))
    assert outage.down and not outage.retry_due()  # callers take their fallback at once meanwhile
    for _ in range(50):
        outage.recovered()
    assert not outage.down and outage.outages == 1
    outage.failed(TimeoutError("timed out"))
    outage.recovered()
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == (
        "the thing unavailable (ConnectionRefusedError: [Errno 111] Connection refused (attempt 0)); "
        "work goes elsewhere until it is back"
    )
    assert lines[1].startswith("the thing reachable again after ")
    assert len(lines) == 4 and outage.outages == 2  # the second outage: its own two lines
    assert all(record.levelno == logging.WARNING for record in caplog.records)


def test_a_retry_is_due_after_the_pause() -> None:
    outage = Outage("the thing", "nothing", retry_secs=0.0)
    outage.failed(OSError("down"))
    assert outage.down and outage.retry_due()


def test_credentials_in_an_error_are_hidden() -> None:
    error = OSError("cannot reach amqp://gateway:s3cret@broker:5672// (and redis://:pw@cache:6379/0)\nmore")
    assert describe(error) == "OSError: cannot reach amqp://***@broker:5672// (and redis://***@cache:6379/0)"
    assert describe(TimeoutError()) == "TimeoutError"


def test_one_caller_at_a_time_tries_the_service_again() -> None:
    now = [100.0]
    outage = Outage("the thing", "nothing", retry_secs=1.0, clock=lambda: now[0])
    outage.failed(OSError("down"))
    assert not outage.retry_due()
    now[0] += 1.0
    assert outage.retry_due()  # this caller tries the service
    assert not outage.retry_due() and not outage.retry_due()  # the others take their fallback meanwhile
    now[0] += 0.5
    outage.failed(OSError("still down"))  # its try failed: the next pause starts from there
    now[0] += 0.9
    assert not outage.retry_due()
    now[0] += 0.1
    assert outage.retry_due()  # a try that neither failed nor succeeded (its caller left) blocks no one
    now[0] += 1.0
    assert outage.retry_due()
    outage.recovered()
    assert all(outage.retry_due() for _ in range(3))  # up: everyone calls it
