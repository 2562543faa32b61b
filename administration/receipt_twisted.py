"""Bounded request receipt under daphne (Twisted's HTTP/1.1 channel): the same limits as
:mod:`administration.receipt` gives uvicorn (D30).

Twisted already caps a head (16 KiB and 500 headers, a bare 400) and closes a connection idle for a
minute, but its idle timer restarts on every byte, so a head or body trickled a byte at a time is
never timed out. :class:`BoundedChannel` takes the caps from the flags (431 with the standard
envelope), and keeps a deadline for a head and the body's progress rule, judged after each read from
the channel's own parsing state. Imported only in a daphne process: importing Twisted's web module
is harmless, but the caller installs the asyncio reactor first.
"""

from __future__ import annotations

from typing import Any

from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol

from administration.receipt import BODY, DONE, HEAD, IDLE, ReceiptLimits, rejection
from inference import errors

__all__ = ["BoundedChannel", "GatewayRequest", "bounded_factory"]


class BoundedChannel(HTTPChannel):
    """Twisted's channel with :class:`ReceiptLimits` (set on a subclass by :func:`bounded_factory`)."""

    limits = ReceiptLimits()

    def __init__(self) -> None:
        super().__init__()
        self._phase = IDLE
        self._receipt_timer: Any = None  # an IDelayedCall
        self._body_since = 0.0
        self._body_bytes = 0
        self._last_read = 0.0

    def connectionMade(self) -> None:
        super().connectionMade()
        self._arm(self.limits.head_timeout_secs)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        super().connectionLost(reason)

    def dataReceived(self, data: bytes) -> None:
        super().dataReceived(data)
        if self.transport is None or getattr(self.transport, "disconnecting", False):
            return
        phase = self._current_phase()
        if phase != self._phase:
            self._disarm()
            self._phase = phase
            if phase == HEAD:
                self._arm(self.limits.head_timeout_secs)
            elif phase == BODY:
                self._body_since = self._last_read = self._now()
                self._body_bytes = 0
                self._arm(self.limits.body_timeout_secs)
        elif phase == BODY:
            self._last_read = self._now()
            self._body_bytes += len(data)

    def _current_phase(self) -> int:
        """Where this channel is in the current request, from its parsing state after a read."""
        if self.line_mode:  # the head of a request, or between requests
            first_line_pending = getattr(self, "_HTTPChannel__first_line", 1)
            return HEAD if self._buffer or not first_line_pending else IDLE
        if self._handlingRequest:
            return DONE  # the request is in; later bytes wait for its answer
        return BODY if self._transferDecoder is not None else DONE

    def _now(self) -> float:
        return float(self.factory.reactor.seconds()) if self.factory is not None else 0.0

    def _arm(self, secs: float) -> None:
        self._receipt_timer = self.callLater(secs, self._on_deadline)

    def _disarm(self) -> None:
        if self._receipt_timer is not None:
            if self._receipt_timer.active():
                self._receipt_timer.cancel()
            self._receipt_timer = None

    def _on_deadline(self) -> None:
        self._receipt_timer = None
        phase = self._phase
        if phase == IDLE:  # the connection's own clock (any phase change re-arms): it never sent a byte
            self.loseConnection()
        elif phase == HEAD:
            self._reject(errors.request_timeout("request head", self.limits.head_timeout_secs))
        elif phase == BODY:
            deadline = self.limits.body_deadline(self._body_since, self._last_read, self._body_bytes)
            remaining = deadline - self._now()
            if remaining > 0:
                self._arm(remaining)
            else:
                self._reject(errors.request_timeout("request body", self.limits.body_timeout_secs))

    def _reject(self, error: errors.GatewayError) -> None:
        self._disarm()
        self._phase = DONE
        transport: Any = self.transport  # zope interfaces confuse the type checker
        if transport is not None:
            transport.write(rejection(error))
        self.loseConnection()

    def _respondToBadRequestAndDisconnect(self) -> None:
        if self._receivedHeaderSize > self.totalHeadersSize or self._receivedHeaderCount > self.maxHeaders:
            self._reject(errors.request_head_too_large(self.limits.max_head_bytes, self.limits.max_headers))
        else:
            super()._respondToBadRequestAndDisconnect()

    def lineLengthExceeded(self, line: bytes) -> None:
        self._reject(errors.request_head_too_large(self.limits.max_head_bytes, self.limits.max_headers))


class GatewayRequest(WebRequest):
    """daphne's request, ending the connection when the application raised after its response
    started (a relayed body broken off upstream, :class:`~inference.asgi_io.ResponseAborted`, or an
    escaped bug). daphne answers such an exception with a 500 page, which cannot start twice: the
    ValueError that raises stops its application checker for good, and the client waits on a
    response that never ends. Closed instead, the client sees the body cut short."""

    def handle_exception(self, exception: BaseException) -> None:
        if self._response_started:
            transport: Any = self.channel.transport if self.channel is not None else None
            if transport is not None:
                transport.loseConnection()
            return
        super().handle_exception(exception)


def bounded_factory(limits: ReceiptLimits) -> type[HTTPFactory]:
    """daphne's HTTP factory building :class:`BoundedChannel` connections with ``limits``."""
    channel = type(
        "GatewayHttpChannel",
        (BoundedChannel,),
        {"limits": limits, "totalHeadersSize": limits.max_head_bytes, "maxHeaders": limits.max_headers,
         "MAX_LENGTH": limits.max_head_bytes},
    )

    class GatewayHttpFactory(HTTPFactory):
        def protocol(self) -> _GenericHTTPChannelProtocol:
            return _GenericHTTPChannelProtocol(channel())

        def buildProtocol(self, addr: Any) -> Any:
            built = super().buildProtocol(addr)
            if built is not None:
                built.requestFactory = GatewayRequest
            return built

    return GatewayHttpFactory
