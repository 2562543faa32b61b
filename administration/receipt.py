"""Bounded request receipt under uvicorn: how much of a request head the gateway reads, and how long
it waits for a head or a body (issue 14, D30).

uvicorn's httptools protocol parses any head it is given (no size or count limit) and times only the
idle gap between requests. :class:`BoundedHttpToolsProtocol` adds, per connection:

- **head size and header count**: the request target plus every header line are counted as the
  parser hands them over; past ``--max-request-head-bytes`` or ``--max-request-headers`` the request
  gets 431 with the standard envelope and the connection is closed. A head still arriving is judged
  by the bytes read too (a header line that never ends reaches no callback), so the parser sees at
  most one socket read (256 KiB under uvloop) past the limit and 1 KiB, and no head can hold the
  event loop or memory for longer than that read takes;
- **a head deadline**: a connection that sends nothing, or part of a head, for
  ``--request-head-timeout-secs`` is closed (408 when part of a request arrived);
- **body progress**: once the head is in, the body must keep arriving: no gap longer than
  ``--request-body-timeout-secs`` and, after that long, at least ``--min-request-body-rate`` bytes a
  second on average; otherwise 408 and a close. Time the gateway itself stops reading (the
  application has not taken the last part yet, or a pipelined request waits its turn) is not counted
  against the client.

Nothing of this runs on the common path but two counters per header: a timer is armed only when a
read ends inside a head or a body, and the connection's first head cancels the one armed when it
opened. The daphne equivalent is in :mod:`administration.receipt_twisted`.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from administration.response_cycle import LeanCycle
from common.config import GatewayConfig
from inference import errors

__all__ = ["ReceiptLimits", "BoundedHttpToolsProtocol", "bounded_protocol", "rejection", "IDLE", "HEAD", "BODY", "DONE"]

IDLE, HEAD, BODY, DONE = 0, 1, 2, 3  # where a connection is in its current request
_LINE_OVERHEAD = 4  # ": " and CRLF around each header line
# What a head's raw bytes hold beyond what --max-request-head-bytes counts (method, version, the
# request line's spaces and CRLF, the blank line, spaces around values): allowed on top of the limit
# when an unfinished head is judged by the bytes read.
_REQUEST_LINE_SLACK = 1024


@dataclass(frozen=True, slots=True)
class ReceiptLimits:
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100
    head_timeout_secs: float = 30.0
    body_timeout_secs: float = 30.0
    min_body_rate: int = 1024  # bytes per second after body_timeout_secs; 0: no rate rule

    def body_deadline(self, since: float, last_read: float, received: int) -> float:
        """When a body whose clock started at ``since``, last read at ``last_read``, with ``received``
        bytes since then, is too slow: no gap past the body timeout, and after it an average rate at
        least the minimum."""
        deadline = last_read + self.body_timeout_secs
        if self.min_body_rate > 0:
            deadline = min(deadline, since + self.body_timeout_secs + received / self.min_body_rate)
        return deadline

    @classmethod
    def of(cls, config: GatewayConfig) -> ReceiptLimits:
        return cls(
            max_head_bytes=config.max_request_head_bytes,
            max_headers=config.max_request_headers,
            head_timeout_secs=config.request_head_timeout_secs,
            body_timeout_secs=config.request_body_timeout_secs,
            min_body_rate=config.min_request_body_rate,
        )


def rejection(error: errors.GatewayError) -> bytes:
    """A complete HTTP/1.1 answer that ends the connection: the error's envelope and headers."""
    headers, body = errors.render_json(error)
    lines = [f"HTTP/1.1 {error.status} {_REASONS.get(error.status, 'Error')}".encode()]
    lines += [name + b": " + value for name, value in headers]
    lines += [b"content-length: " + str(len(body)).encode(), b"connection: close", b"", body]
    return b"\r\n".join(lines)


_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}


class _HeadTooLarge(Exception):
    pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :class:`ReceiptLimits` (``limits`` is set on a
    subclass by :func:`bounded_protocol`)."""

    limits = ReceiptLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = IDLE
        self._head_bytes = 0
        self._header_count = 0
        self._head_read = 0  # raw bytes of an unfinished head, as read (request line and spacing too)
        self._began = 0  # requests begun in the read being parsed
        self._receipt_timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._body_since = 0.0  # when the body's clock started (or restarted after a pause)
        self._body_bytes = 0  # received since _body_since
        self._last_read = 0.0

    # Connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection that never sends a byte is held no longer than a head may take.
        self._arm(self.loop.time() + self.limits.head_timeout_secs)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:  # the keep-alive clock, left armed while busy
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        if isinstance(self.cycle, LeanCycle):
            self.cycle.client_left()  # a disconnect watch learns it at once (response_cycle)

    # The keep-alive clock: one timer per connection, not one armed and cancelled per request (each
    # ~2 us under uvloop; issue 27, D86). uvicorn arms ``timeout_keep_alive`` seconds at every
    # response's end and cancels it when the next request's bytes arrive; here a request's bytes mark
    # the connection busy, a response's end idle since then, and the timer, when it fires, closes an
    # idle connection whose time is up or sets itself for the rest of it (a busy one is set again at
    # its response's end).

    _idle_since: float | None = None

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None

    def on_response_complete(self) -> None:
        """uvicorn's (0.54), the keep-alive clock as above."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = now = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(now + self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        idle = self._idle_since
        if idle is None:  # serving a request: set again when it is answered
            return
        due = idle + self.timeout_keep_alive
        if self.loop.time() >= due:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)

    def handle_websocket_upgrade(self) -> None:
        self._disarm()
        self._phase = DONE
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        before = self._phase
        self._began = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._reject(errors.request_head_too_large(self.limits.max_head_bytes, self.limits.max_headers))
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        phase = self._phase
        if phase == HEAD:
            # The read ended inside a head. The parser counts a header line only once it ends (and
            # keeps its partial value by concatenation, quadratic in its length): the head's raw
            # bytes are judged here, so a line that never ends is refused at the read that passes
            # the limit, not after megabytes. A head that began after another request's bytes in
            # this same read is counted from the next read on (at most one read later).
            if not self._began:
                self._head_read += len(data)
            else:
                self._head_read = len(data) if self._began == 1 and before in (IDLE, DONE) else 0
            if self._head_read > self.limits.max_head_bytes + _REQUEST_LINE_SLACK:
                self._reject(errors.request_head_too_large(self.limits.max_head_bytes, self.limits.max_headers))
                return
            if self._receipt_timer is None:
                self._arm(self.loop.time() + self.limits.head_timeout_secs)
        elif phase == BODY:
            now = self._last_read = self.loop.time()
            if self._receipt_timer is None:  # the body's first read: its bytes count as credit
                self._body_since = now
                self._arm(now + self.limits.body_timeout_secs)

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = HEAD
        self._began += 1
        self._head_bytes = 0
        self._header_count = 0
        if self._receipt_timer is not None:  # the first request's head: the connection's clock ends
            self._disarm()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._head_bytes += len(url)
        if self._head_bytes > self.limits.max_head_bytes:
            raise _HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + _LINE_OVERHEAD
        self._header_count += 1
        if self._head_bytes > self.limits.max_head_bytes or self._header_count > self.limits.max_headers:
            raise _HeadTooLarge
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._phase = BODY
        self._body_bytes = 0
        if self._receipt_timer is not None:
            self._disarm()
        self._begin_cycle()

    def _begin_cycle(self) -> None:
        """uvicorn's ``on_headers_complete`` (0.54), the request's cycle a :class:`LeanCycle`."""
        parser = self.parser
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed_url.query or b""
        if self.limit_concurrency is not None and (
            len(self.connections) >= self.limit_concurrency or len(self.tasks) >= self.limit_concurrency
        ):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        else:
            app = self.app
        existing_cycle = self.cycle
        self.cycle = LeanCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        self.cycle.loop = self.loop
        if existing_cycle is None or existing_cycle.response_complete:
            self._start_asgi_task(self.cycle, app)
        else:  # pipelined requests wait their turn
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, app))

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = DONE
        if self._receipt_timer is not None:
            self._disarm()
        super().on_message_complete()

    # The clock

    def _arm(self, deadline: float) -> None:
        self._deadline = deadline
        self._receipt_timer = self.loop.call_at(deadline, self._on_deadline)

    def _disarm(self) -> None:
        if self._receipt_timer is not None:
            self._receipt_timer.cancel()
            self._receipt_timer = None

    def _on_deadline(self) -> None:
        self._receipt_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        phase = self._phase
        if phase == IDLE:  # connected, never sent a byte
            self.transport.close()
        elif phase == HEAD:
            self._reject(errors.request_timeout("request head", self.limits.head_timeout_secs))
        elif phase == BODY:
            now = self.loop.time()
            if self.flow is not None and self.flow.read_paused:
                # The gateway stopped reading, not the client: restart the body's clock.
                self._body_since = self._last_read = now
                self._body_bytes = 0
                self._arm(now + self.limits.body_timeout_secs)
                return
            deadline = self.limits.body_deadline(self._body_since, self._last_read, self._body_bytes)
            if now < deadline:
                self._arm(deadline)
            else:
                self._reject(errors.request_timeout("request body", self.limits.body_timeout_secs))

    def _reject(self, error: errors.GatewayError) -> None:
        """Answer ``error`` (unless a response already started) and close. An application already
        reading the body sees the client as gone."""
        self._disarm()
        self._phase = DONE
        cycle = self.cycle
        started = cycle is not None and not cycle.response_complete and cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
            if isinstance(cycle, LeanCycle):
                cycle.client_left()
        if not started:
            self.transport.write(rejection(error))
        self.transport.close()


def bounded_protocol(limits: ReceiptLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol class uvicorn builds per connection, with ``limits``."""
    return type("GatewayHttpProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})
