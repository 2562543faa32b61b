"""What counts as an unhandled exception in a log, for the check that fails any test whose run logged
one (tests/conftest.py for this process, tests/e2e/conftest.py for the gateway processes a test
starts). A test that provokes one on purpose says so with ``@pytest.mark.escapes_expected``.

An unhandled exception is one nobody answered: the gateway's escape record (``inference.escapes``),
Django's record of a view's exception, what the servers and asyncio log for an exception that reached
them. Exceptions a loop catches and logs on purpose (a failed poll, a failed job) are not.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from inference.escapes import ESCAPE_LOGGER

__all__ = ["MARKER", "EscapeWatch", "is_escape", "escape_lines", "watching_escapes", "describe"]

MARKER = "escapes_expected"

# The first words of what uvicorn, daphne, aiohttp's server and asyncio log for an exception that
# reached them, and of the gateway's own escape record.
SIGNATURES = (
    "Exception in ASGI application",
    "Exception inside application",
    "Error handling request",
    "Task exception was never retrieved",
    "Future exception was never retrieved",
    "Exception in callback",
    "unhandled exception on ",
)
# Loggers that do not propagate to the root (settings.LOGGING, uvicorn's own configuration).
_NON_PROPAGATING = ("inference", "administration", "uvicorn", "uvicorn.error")


def is_escape(record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
        return False
    if record.name == ESCAPE_LOGGER:
        return True
    if record.name == "django.request" and record.exc_info is not None:
        return getattr(record, "status_code", 500) >= 500
    message = str(record.msg)
    return any(message.startswith(signature) for signature in SIGNATURES)


def escape_lines(log_text: str) -> list[str]:
    """The lines of a process's log that start an unhandled exception's record."""
    return [line for line in log_text.splitlines() if any(signature in line for signature in SIGNATURES)]


class EscapeWatch(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if is_escape(record) and not any(seen is record for seen in self.records):
            self.records.append(record)


@contextmanager
def watching_escapes() -> Iterator[EscapeWatch]:
    """A watch on the root logger and the loggers that do not propagate to it."""
    watch = EscapeWatch()
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in _NON_PROPAGATING)]
    for logger in loggers:
        logger.addHandler(watch)
    try:
        yield watch
    finally:
        for logger in loggers:
            logger.removeHandler(watch)


def describe(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n\n".join(formatter.format(record) for record in records)
