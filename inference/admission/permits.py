"""Concurrency admission (spec 1, Limits: concurrency): ``--max-concurrent-requests`` permits and a
FIFO queue of ``--queue-size`` waiters, each waiting at most ``--queue-timeout-secs``.

A released permit is handed straight to the oldest waiter (``in_flight`` stays the same), so a
later request never overtakes an earlier one: a new arrival only takes a free permit when nobody
is queued. A waiter that is cancelled or times out after being handed a permit passes it on.
"""

from __future__ import annotations

import asyncio
from collections import deque

from common.telemetry import record_admission_rejected
from inference import errors

__all__ = ["PermitPool"]


class PermitPool:
    """``limit`` permits per process; use ``await acquire()`` then ``release()`` on every path."""

    __slots__ = ("limit", "queue_size", "timeout_secs", "in_flight", "_waiters")

    def __init__(self, limit: int, queue_size: int, timeout_secs: float) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.queue_size = queue_size
        self.timeout_secs = timeout_secs
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, *, patient: bool = False) -> None:
        """Take a permit, queuing FIFO when none is free.

        Raises 429 admission_queue_full when the queue is full (or disabled) and 503
        admission_queue_timeout after ``timeout_secs`` in the queue. A ``patient`` waiter (a
        background run: nobody waits on the connection, and their number has its own limit) joins the
        same FIFO whatever the queue size and waits until a permit is handed to it.
        """
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return
        if not patient and len(self._waiters) >= self.queue_size:
            record_admission_rejected("full")
            raise errors.admission_queue_full()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(None if patient else self.timeout_secs):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                # A permit was handed over as we were cancelled or timed out: pass it on.
                self.release()
            else:
                waiter.cancel()
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            if isinstance(exc, TimeoutError):
                record_admission_rejected("timeout")
                raise errors.admission_queue_timeout(self.timeout_secs) from None
            raise

    def release(self) -> None:
        """Return a permit: to the oldest live waiter if there is one, else to the pool."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1
