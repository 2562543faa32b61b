"""The response writer: wraps ASGI ``send`` for one response of one surface.

It owns what the client sees and when: the gateway's headers at response start (X-Request-ID,
``x-gw-overhead-ms``, the rate-limit headers), the first chunk's time and the stream's end for the
router metrics, the disconnect watch (stopped right before the final body message, since servers
report ``http.disconnect`` once a response completes), and the surface's framing. An upstream hands
it bytes or events; it never writes to ``send`` itself.
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Awaitable, Callable, NoReturn, Protocol

from common.telemetry import body_send
from inference.accounting import TokenUsage
from inference.asgi_io import SSE_HEADERS, DisconnectWatch, Receive, ResponseAborted, Send, send_error
from inference.errors import GatewayError
from inference.writers.framing import Framing

__all__ = ["ResponseClock", "ResponseWriter", "StreamObserver"]

log = logging.getLogger(__name__)

_TAIL = 32  # bytes of a stream's end that show its closing event
_DATA = b"data:"


class StreamObserver(Protocol):
    """Told when a stream's first chunk goes out and when it ends (TTFT, TPOT, duration).

    Times are ``time.perf_counter()`` values; ``events`` counts the SSE data events written."""

    def first_chunk(self, at: float) -> None: ...

    def stream_ended(self, first_at: float, ended_at: float, events: int) -> None: ...


class ResponseClock:
    """Times one request for ``x-gw-overhead-ms`` (time in the gateway minus time waiting on the
    upstream, up to the response start) and carries the other gateway headers for the response."""

    __slots__ = ("started", "upstream_secs", "headers")

    def __init__(self, started: float) -> None:
        self.started = started
        self.upstream_secs = 0.0
        self.headers: tuple[tuple[bytes, bytes], ...] = ()

    def stamp(self, headers: list[tuple[bytes, bytes]], upstream_secs: float) -> None:
        """Add the gateway's headers; ``upstream_secs`` is time spent on the upstream since the
        attempts loop last measured (reading a whole body)."""
        overhead = perf_counter() - self.started - self.upstream_secs - upstream_secs
        headers.append((b"x-gw-overhead-ms", b"%.3f" % (max(overhead, 0.0) * 1000.0)))
        if self.headers:
            headers.extend(self.headers)


class ResponseWriter:
    """One response: a whole body, or a stream of chunks in the surface's framing, or an error."""

    __slots__ = ("_send", "request_id", "clock", "framing", "observer", "started", "_watch", "_first_at",
                 "_events", "_tail", "usage_so_far")

    def __init__(self, send: Send, request_id: bytes, clock: ResponseClock, framing: Framing) -> None:
        self._send = send
        self.request_id = request_id
        self.clock = clock
        self.framing = framing
        self.observer: StreamObserver | None = None
        self.started = False  # the response head went out
        self._watch: DisconnectWatch | None = None
        self._first_at = 0.0
        self._events = 0
        self._tail = b""
        # What the answer being written used so far, for a request the client leaves before its end
        # (its accounting, D66): set by a surface that tallies as it writes.
        self.usage_so_far: Callable[[], TokenUsage] | None = None

    @property
    def first_at(self) -> float:
        """perf_counter() when the stream's first chunk went out (0.0: none did)."""
        return self._first_at

    @property
    def events(self) -> int:
        """The SSE data events of the stream written so far (a cut relayed stream's estimate, D80)."""
        return self._events

    # --- the disconnect watch ---------------------------------------------------------------------
    def watch(self, receive: Receive) -> DisconnectWatch:
        """Cancel the current task when the client disconnects, until the final body message."""
        self._watch = DisconnectWatch(receive)
        return self._watch

    def _before_final(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    # --- errors -----------------------------------------------------------------------------------
    async def error(self, error: GatewayError) -> None:
        """An error response, or, once the response started, the error in-band and the stream's end."""
        self._before_final()
        if self.started:
            await self.break_stream(error)
            return
        self.started = True
        await send_error(self._send, error, self.request_id)

    # --- whole bodies -----------------------------------------------------------------------------
    async def whole(self, status: int, content_type: bytes, body: bytes, upstream_secs: float = 0.0) -> None:
        headers = [(b"x-request-id", self.request_id), (b"content-length", b"%d" % len(body))]
        if content_type:
            headers.append((b"content-type", content_type))
        self.clock.stamp(headers, upstream_secs)
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        self._before_final()
        await self._send({"type": "http.response.body", "body": body})

    # --- whole bodies relayed as they arrive (too long to hold) ----------------------------------------
    async def open_whole(self, status: int, content_type: bytes, length: int | None, upstream_secs: float = 0.0) -> None:
        """The head of a whole body that follows in calls of :meth:`part`: with the upstream's length when it
        declared one, else the server frames it (chunked)."""
        headers = [(b"x-request-id", self.request_id)]
        if length is not None:
            headers.append((b"content-length", b"%d" % length))
        if content_type:
            headers.append((b"content-type", content_type))
        self.clock.stamp(headers, upstream_secs)
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def part(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_whole(self) -> None:
        self._before_final()
        await self._send({"type": "http.response.body", "body": b""})

    def abort(self, reason: str) -> NoReturn:
        """The body begun with :meth:`open_whole` cannot be finished: the connection is closed without
        its end (see :class:`~inference.asgi_io.ResponseAborted`)."""
        self._before_final()
        raise ResponseAborted(reason)

    # --- streams ----------------------------------------------------------------------------------
    async def open_stream(self) -> None:
        headers = [*SSE_HEADERS, (b"x-request-id", self.request_id)]
        self.clock.stamp(headers, 0.0)
        self.started = True
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        self._send = body_send(self._send)  # the body's messages straight to the server's send

    async def chunk(self, data: bytes, last: bool = False) -> None:
        """Framed bytes of the stream; ``last`` makes this the final body message (closed by the
        framing's closing event unless ``data`` already ends with it)."""
        if not self._first_at:
            self._first_at = perf_counter()
            if self.observer is not None:
                self.observer.first_chunk(self._first_at)
        self._events += data.count(_DATA)
        if last:
            if not self.framing.closes(self._tail + data[-_TAIL:]):
                data += self.framing.closing
            self._finish()
            await self._send({"type": "http.response.body", "body": data})
            return
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        self._tail = data[-_TAIL:] if len(data) >= _TAIL else (self._tail + data)[-_TAIL:]

    def event(self, data: bytes) -> Awaitable[None]:
        """:meth:`chunk` of one whole event of at least 32 bytes, not the last (a surface's per-token
        chunk): the send's awaitable, no coroutine of its own per chunk; await it at once."""
        if not self._first_at:
            self._first_at = perf_counter()
            if self.observer is not None:
                self.observer.first_chunk(self._first_at)
        self._events += 1
        self._tail = data[-_TAIL:]
        return self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self) -> None:
        """The upstream's stream ended: close it in the surface's framing (once)."""
        self._finish()
        final = b"" if self.framing.closes(self._tail) else self.framing.closing
        await self._send({"type": "http.response.body", "body": final})

    async def break_stream(self, error: GatewayError) -> None:
        """The stream failed after it started: the error in-band, then the closing event. An event
        the upstream left unfinished is ended first, so the error arrives as an event of its own."""
        error_event = self.framing.error_event(error)
        if self._tail and not self._tail.endswith((b"\n\n", b"\r\n\r\n")):
            error_event = b"\n\n" + error_event
        await self._send({"type": "http.response.body", "body": error_event, "more_body": True})
        self._before_final()
        await self._send({"type": "http.response.body", "body": self.framing.closing})

    def _finish(self) -> None:
        self._before_final()
        if self.observer is not None and self._first_at:
            self.observer.stream_ended(self._first_at, perf_counter(), self._events)
