"""An exception that escapes a route: answered with the spec's 500 envelope and logged once, with the
request id, by the ``inference.escapes`` logger.

Every route answers its own errors; this is the last line, for bugs. Costs nothing until something
escapes: the data plane's routes are called inside a ``try`` (the metrics wrapper of ``send`` already
knows whether the response started); other routes go through :func:`call_guarded`, whose ``send``
wrapper notes it. Once the response has started nothing can be answered: the exception is re-raised
for the server to close the connection and log it (once), with the request id added as a note.
"""

from __future__ import annotations

import logging

from inference import errors
from inference.asgi_io import ASGIApp, Message, Receive, Scope, Send, request_id_for, send_error

__all__ = ["ESCAPE_LOGGER", "answer_escape", "call_guarded", "log_escape"]

ESCAPE_LOGGER = "inference.escapes"
log = logging.getLogger(ESCAPE_LOGGER)


def log_escape(method: str, path: str, request_id: str, exc: BaseException) -> None:
    """The one log record of an escaped exception (ERROR, with its traceback)."""
    log.error("unhandled exception on %s %s (request %s)", method, path, request_id, exc_info=exc)


async def answer_escape(scope: Scope, send: Send, exc: Exception, response_started: bool) -> None:
    """Call from the ``except`` block that caught ``exc`` escaping the route of ``scope``."""
    request_id = request_id_for(scope)
    if response_started:
        exc.add_note(f"request {request_id.decode('latin-1')}: escaped after the response started")
        raise exc
    log_escape(str(scope.get("method")), str(scope.get("path")), request_id.decode("latin-1"), exc)
    await send_error(send, errors.internal_error(), request_id)


class _StartWatch:
    """``send`` noting whether the response started."""

    __slots__ = ("_send", "started")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


async def call_guarded(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app`` for one HTTP request, with an escaping exception answered as above."""
    watch = _StartWatch(send)
    try:
        await app(scope, receive, watch.send)
    except Exception as exc:
        await answer_escape(scope, send, exc, watch.started)
