"""An exception escaping a Django route (control-plane API, console): the spec's 500 envelope with
the request id, logged once with that id by the ``inference.escapes`` logger, like the data plane's.

Django answers such an exception with ``handler500`` (:func:`server_error`) and then logs it itself
(``django.request``, "Internal Server Error: /path", with the traceback). :class:`OneEscapeRecord`,
a filter on that logger, turns that record into the gateway's own (:func:`inference.escapes.log_escape`)
so each escape is one record, in one logger, with the id the client was answered with.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse

from administration.api.envelope import envelope_response
from inference import errors
from inference.asgi_io import new_request_id, sane_request_id
from inference.escapes import log_escape

__all__ = ["OneEscapeRecord", "envelope_response", "request_id_of", "server_error"]

_REQUEST_ID = "gw.request_id"  # where the id is kept in request.META once made


def request_id_of(request: HttpRequest) -> str:
    """The client's X-Request-ID when sane, else one made once for this request."""
    made: str | None = request.META.get(_REQUEST_ID)
    if made is None:
        given = request.headers.get("X-Request-ID", "").encode("latin-1", "replace")
        made = request.META[_REQUEST_ID] = (sane_request_id(given) or new_request_id()).decode("latin-1")
    return made


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: the 500 envelope, carrying the request id the log record names."""
    return envelope_response(errors.internal_error(), request_id_of(request))


class OneEscapeRecord(logging.Filter):
    """On ``django.request``: the record of an exception that escaped a view (a 500 with its
    exception) is logged again by ``inference.escapes`` with the request id, and dropped here. Every
    other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        escaped = getattr(record, "status_code", 0) >= 500 and record.exc_info is not None
        if not escaped or record.exc_info is None or record.exc_info[1] is None or not isinstance(request, HttpRequest):
            return True  # a 4xx Django logs with its exception (PermissionDenied, ...), any other record
        log_escape(request.method or "", request.path, request_id_of(request), record.exc_info[1])
        return False
