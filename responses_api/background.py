"""Background responses (spec 2, Background mode): the queued object is stored and returned at once,
and the run continues as a task of this process behind that id.

- At most --max-background-responses runs at once per process (more: 429
  background_responses_limit_reached); 0 turns background mode off (requests run in the foreground).
- The run moves the stored status queued → in_progress, and at its end stores the finished object only
  while the status is still queued or in_progress: a cancel (from any gateway process sharing the
  store) wins. The task also reads the stored status every :data:`CANCEL_POLL_SECS` and stops the run
  when it was cancelled, which closes the engine stream (Abort).
- A run that fails before any output is stored as failed with the error.
- A run marks its stored response every :data:`HEARTBEAT_SECS`; one not marked for
  :data:`RUN_STALE_SECS` belongs to a process that died, and the db backend's readers store it as failed.
- With ``stream: true`` the client that started the run reads it through a :class:`RunFeed` while it
  stays: its disconnect detaches the feed and the run goes on to its stored end; a cancel ends the
  stream without a terminal event.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from time import perf_counter
from typing import Awaitable, Callable

from common.config import current_config
from inference.accounting import LATER, Delivered
from inference.asgi_io import Message, Send
from inference.errors import GatewayError
from inference.writers import RESPONSES_SSE, ResponseClock, ResponseWriter

__all__ = ["BackgroundRuns", "BACKGROUND", "CANCEL_POLL_SECS", "FEED_PENDING_CHUNKS", "FeedAnswer", "HEARTBEAT_SECS", "RUN_STALE_SECS", "RunFeed",
           "UNSTORED_KEEP_SECS", "limit_reached", "run_writer"]

log = logging.getLogger(__name__)

CANCEL_POLL_SECS = 1.0
"""How often a run looks for a cancel made through another process."""

HEARTBEAT_SECS = 10.0
"""How often a run marks its stored response as still running (its ``updated_at``)."""

RUN_STALE_SECS = 60.0
"""A queued or in-progress background response not marked for this long belongs to a process that
is gone (killed, lost its host): readers of the db backend see it, and store it, as failed."""

UNSTORED_KEEP_SECS = 600.0
"""How long the result of a ``store: false`` background response stays readable after it ends (spec
2: about ten minutes); ``purge_history`` deletes the ones a stopped process left."""


def limit_reached() -> GatewayError:
    return GatewayError(
        429, "background_responses_limit_reached",
        "Too many background responses are running; try again later or run in the foreground",
    )  # fmt: skip


async def _discard(message: Message) -> None:
    return None


def run_writer(request_id: str, send: Send = _discard) -> ResponseWriter:
    """A background run's writer: into ``send`` (a streaming client's :class:`RunFeed`), or nowhere
    when no client reads the run (its result goes to the store)."""
    return ResponseWriter(send, request_id.encode(), ResponseClock(perf_counter()), RESPONSES_SSE)


FEED_PENDING_CHUNKS = 64
"""Chunks a streamed background run may hold for its client before it waits for the client to read
(the bound a foreground stream has in the server's send buffer)."""


class RunFeed:
    """A streamed background run's bytes, on their way to the client that started it.

    The run writes through :meth:`writer` (an ASGI ``send``: its response start is dropped, the
    client's answer opens its own); the client reads with :meth:`read`. At most
    :data:`FEED_PENDING_CHUNKS` chunks wait unread before the run waits too; once the client is gone
    (:meth:`detach`) the run's writes are dropped and it never waits."""

    __slots__ = ("_pending", "_closed", "_detached", "_readable", "_writable")

    def __init__(self) -> None:
        self._pending: deque[bytes] = deque()
        self._closed = False
        self._detached = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def writer(self, request_id: str) -> ResponseWriter:
        return run_writer(request_id, self._send)

    def push(self, data: bytes) -> None:
        """Bytes from outside the run (the events before it starts, a failure after it)."""
        if not self._detached and data:
            self._pending.append(data)
            self._readable.set()

    async def _send(self, message: Message) -> None:
        if message["type"] != "http.response.body":
            return
        self.push(message.get("body", b""))
        if not message.get("more_body", False):
            self.close()
        elif len(self._pending) >= FEED_PENDING_CHUNKS and not self._detached:
            self._writable.clear()
            await self._writable.wait()

    def close(self) -> None:
        """The run ended (finished, failed or cancelled): the client reads what is left, then the end."""
        self._closed = True
        self._readable.set()

    def detach(self) -> None:
        """The client is gone: drop what it did not read and never hold the run again."""
        self._detached = True
        self._pending.clear()
        self._writable.set()

    async def read(self) -> bytes | None:
        """Everything written since the last read, or None once the run ended and all was read."""
        while not self._pending:
            if self._closed:
                return None
            self._readable.clear()
            await self._readable.wait()
        data = b"".join(self._pending)
        self._pending.clear()
        self._writable.set()
        return data


class FeedAnswer:
    """The client's side of a streamed background run: what the run writes, until it ends or the
    client leaves (the run goes on)."""

    __slots__ = ("feed",)
    status = 200

    def __init__(self, feed: RunFeed) -> None:
        self.feed = feed

    async def forward(self, writer: ResponseWriter) -> Delivered:
        try:
            await writer.open_stream()
            while (data := await self.feed.read()) is not None:
                await writer.chunk(data)
            await writer.end_stream()
        finally:
            self.feed.detach()
        return LATER  # the run is the request: it is accounted when the run ends

    async def discard(self) -> None:
        self.feed.detach()


class BackgroundRuns:
    """This process's background runs (kept referenced until they end)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._forgets: set[asyncio.TimerHandle] = set()
        self.stopping = False  # the gateway shuts down: runs cancelled now are stored as failed

    def __len__(self) -> int:
        return len(self._tasks)

    @staticmethod
    def allowed() -> bool:
        """Whether background mode is on at all (--max-background-responses above 0)."""
        return current_config().max_background_responses > 0

    def start(
        self,
        response_id: str,
        run: Callable[[], Awaitable[None]],
        cancelled: Callable[[], Awaitable[bool]],
        heartbeat: Callable[[], Awaitable[object]],
    ) -> None:
        """Start ``run``; stop it when ``cancelled()`` says the stored response was cancelled;
        ``heartbeat()`` every :data:`HEARTBEAT_SECS` while it runs. Raises the 429 when the limit
        is reached."""
        if len(self._tasks) >= current_config().max_background_responses:
            raise limit_reached()
        task = asyncio.get_running_loop().create_task(self._run(response_id, run, cancelled, heartbeat))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        response_id: str,
        run: Callable[[], Awaitable[None]],
        cancelled: Callable[[], Awaitable[bool]],
        heartbeat: Callable[[], Awaitable[object]],
    ) -> None:
        work = asyncio.ensure_future(run())
        loop = asyncio.get_running_loop()
        beat = loop.time()
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=CANCEL_POLL_SECS)
                if not work.done() and await cancelled():
                    log.info("background response %s cancelled; its run stops", response_id)
                    work.cancel()
                elif not work.done() and loop.time() - beat >= HEARTBEAT_SECS:
                    beat = loop.time()
                    await heartbeat()
            await asyncio.gather(work, return_exceptions=True)
        except asyncio.CancelledError:  # shutdown: the run stops too (and stores itself as failed)
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise
        except Exception:  # the store failed while polling: the run goes on, unwatched
            log.exception("background response %s: cancel watch failed", response_id)
            await asyncio.gather(work, return_exceptions=True)

    def forget_later(self, delete: Callable[[], Awaitable[object]], after_secs: float | None = None) -> None:
        """Run ``delete`` (an unstored result's removal) ``after_secs`` from now (default
        :data:`UNSTORED_KEEP_SECS`)."""
        loop = asyncio.get_running_loop()
        after_secs = UNSTORED_KEEP_SECS if after_secs is None else after_secs

        def due() -> None:
            self._forgets.discard(handle)
            task = loop.create_task(self._forget(delete))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        handle = loop.call_later(after_secs, due)
        self._forgets.add(handle)

    @staticmethod
    async def _forget(delete: Callable[[], Awaitable[object]]) -> None:
        try:
            await delete()
        except Exception:  # the store is down: purge_history removes it later
            log.exception("an unstored background response could not be deleted")

    async def aclose(self) -> None:
        """Stop every run (shutdown): each is stored as failed, none is left in progress."""
        self.stopping = True
        for handle in self._forgets:  # left to purge_history
            handle.cancel()
        self._forgets.clear()
        try:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self.stopping = False


BACKGROUND = BackgroundRuns()
"""This process's background runs."""
