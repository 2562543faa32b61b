"""--request-timeout-secs as one timer: the HTTP relay's exchange (D102) and a served engine
generation (D104) are each bounded by one ``loop.call_later``, nothing per chunk or token."""

from __future__ import annotations

import asyncio

__all__ = ["Deadline"]


class Deadline:
    """The total request timeout: cancels the task waiting on the exchange when it passes (as a
    client disconnect does); ``expired`` tells that cancellation from any other (a client disconnect)."""

    __slots__ = ("_task", "_handle", "expired", "_pending", "seconds")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._pending = False  # a cancellation of ours not yet undone
        self._task = asyncio.current_task(loop)
        self._handle = loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._pending = True
            self._task.cancel()

    def follow(self) -> None:
        """The exchange goes on in the current task (an answer forwarded by another than opened it)."""
        self._task = asyncio.current_task()

    def absorb(self) -> bool:
        """After a CancelledError: True (and the cancellation undone) when it was this deadline."""
        if not self.expired:
            return False
        self._undo()
        return True

    def cancel(self) -> None:
        """The exchange is over. A deadline that fired as it ended must not cancel what comes next."""
        self._handle.cancel()
        self._undo()

    def _undo(self) -> None:
        if self._pending and self._task is not None:
            self._pending = False
            self._task.uncancel()
