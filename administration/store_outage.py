"""Control-plane answers while the store is down: 503 in each route family's envelope, at once.

One middleware (settings.MIDDLEWARE) for every Django route: a store error that escapes a view
(:data:`common.db.STORE_ERRORS`: Postgres down, a dropped connection, no pooled connection
within the pool's timeout) is answered 503 instead of 500, with ``Retry-After``:

- the worker endpoints (/workers...): ``{"error": <message>, "code": "SERVICE_UNAVAILABLE"}``;
- the console (/admin/...): a plain-text page;
- every other control route: the general admin envelope, type ``service_unavailable``.

The outage is logged once when it starts and once when it ends (:data:`common.outages.STORE`), not
per request. While it lasts, a request to a route that needs the store is refused at once, without
waiting for the pool, except one every ``STORE.retry_secs``, which checks the
store first (the background loops also see it come back within a second). The data plane never
comes here: it serves from its registry snapshot.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse

from administration.api.errors import ErrorType, error_body, worker_error_body
from common.db import STORE_ERRORS
from common.outages import STORE

__all__ = ["StoreOutageMiddleware", "store_unavailable", "STORE_ROUTES", "STORE_UNAVAILABLE_CODE"]

STORE_UNAVAILABLE_CODE = "SERVICE_UNAVAILABLE"  # the worker endpoints' code (the spec names none for 503)
RETRY_AFTER_SECS = 5
MESSAGE = "The gateway's store is unavailable; try again shortly"
# Route prefixes whose every request reads or writes the store (the fan-out routes and the data
# plane work from the registry snapshot and keep answering). The history store's client routes
# (/v1/conversations..., /v1/responses/{id}...) are refused by responses_api/api/admission.py, which
# knows whether the history is kept in the store, and answers in their own formats.
STORE_ROUTES = ("/workers", "/admin/", "/v1/tokenizers")

_Response = Callable[[HttpRequest], HttpResponse]


def store_unavailable(request: HttpRequest) -> HttpResponse:
    """The 503 answer of ``request``'s route family."""
    path = request.path
    response: HttpResponse
    if path == "/workers" or path.startswith("/workers/"):
        response = JsonResponse(worker_error_body(MESSAGE, STORE_UNAVAILABLE_CODE), status=503)
    elif path.startswith("/admin/"):
        response = HttpResponse(f"503 Service Unavailable\n\n{MESSAGE}.\n", status=503,
                                content_type="text/plain; charset=utf-8")
    else:
        response = JsonResponse(error_body(MESSAGE, ErrorType.SERVICE_UNAVAILABLE), status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECS)
    # Django logs every 5xx answer; the outage has its own two lines (common.outages).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _refused(request: HttpRequest) -> HttpResponse | None:
    """During an outage: the 503 for a route that needs the store, unless this request is the one
    that may try the store again (and the store answers it)."""
    if not STORE.down or not request.path.startswith(STORE_ROUTES):
        return None
    if not STORE.retry_due():
        return store_unavailable(request)
    try:
        with connections["default"].cursor() as cursor:  # a round trip, not a connection held from before
            cursor.execute("SELECT 1")
    except STORE_ERRORS as exc:
        STORE.failed(exc)
        return store_unavailable(request)
    STORE.recovered()
    return None


class StoreOutageMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: _Response | Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if self.is_async:
            return self.__acall__(request)
        return _refused(request) or self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        if STORE.down and request.path.startswith(STORE_ROUTES):  # else no thread hop
            refused = await sync_to_async(_refused)(request)
            if refused is not None:
                return refused
        return await self.get_response(request)  # type: ignore[misc]

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A view (or DRF, which re-raises what it does not handle) met a store error."""
        if not isinstance(exception, STORE_ERRORS):
            return None
        STORE.failed(exception)
        return store_unavailable(request)
