"""Background responses (spec 2, Background mode): the queued object is stored and returned at once,
and the run continues as a task of this process behind that id.

- At most --max-background-responses runs at once per process (more: 429
  background_responses_limit_reached); 0 turns background mode off (requests run in the foreground).
- The run moves the stored status queued → in_progress, and at its end stores the finished object only
  while the status is still queued or in_progress: a cancel (from any gateway process sharing the
  store) wins. The task also reads the stored status every :data:`CANCEL_POLL_SECS` and stops the run
  when it was cancelled, which closes the engine stream (Abort).
- A run that fails before any output is stored as failed with the error.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import Awaitable, Callable

from common.config import current_config
from inference.asgi_io import Message
from inference.errors import GatewayError
from inference.writers import RESPONSES_SSE, ResponseClock, ResponseWriter

__all__ = ["BackgroundRuns", "BACKGROUND", "CANCEL_POLL_SECS", "limit_reached"]

log = logging.getLogger(__name__)

CANCEL_POLL_SECS = 1.0
"""How often a run looks for a cancel made through another process."""


def limit_reached() -> GatewayError:
    return GatewayError(
        429, "background_responses_limit_reached",
        "Too many background responses are running; try again later or run in the foreground",
    )  # fmt: skip


async def _discard(message: Message) -> None:
    return None


def detached_writer(request_id: str) -> ResponseWriter:
    """A writer for a run no client reads (its result goes to the store)."""
    return ResponseWriter(_discard, request_id.encode(), ResponseClock(perf_counter()), RESPONSES_SSE)


class BackgroundRuns:
    """This process's background runs (kept referenced until they end)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    @staticmethod
    def allowed() -> bool:
        """Whether background mode is on at all (--max-background-responses above 0)."""
        return current_config().max_background_responses > 0

    def start(
        self, response_id: str, run: Callable[[], Awaitable[None]], cancelled: Callable[[], Awaitable[bool]]
    ) -> None:
        """Start ``run``; stop it when ``cancelled()`` says the stored response was cancelled.
        Raises the 429 when the limit is reached."""
        if len(self._tasks) >= current_config().max_background_responses:
            raise limit_reached()
        task = asyncio.get_running_loop().create_task(self._run(response_id, run, cancelled))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, response_id: str, run: Callable[[], Awaitable[None]], cancelled: Callable[[], Awaitable[bool]]
    ) -> None:
        work = asyncio.ensure_future(run())
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=CANCEL_POLL_SECS)
                if not work.done() and await cancelled():
                    log.info("background response %s cancelled; its run stops", response_id)
                    work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        except Exception:  # the store failed while polling: the run goes on, unwatched
            log.exception("background response %s: cancel watch failed", response_id)
            await asyncio.gather(work, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop every run (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


BACKGROUND = BackgroundRuns()
"""This process's background runs."""
