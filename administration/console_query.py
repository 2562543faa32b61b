"""Console lists and a query the store cannot take: a NUL character in a query parameter.

Postgres text refuses NUL, so a changelist filtered or searched with one (``?status__exact=%00``)
failed when its query ran, a 500. Every console list is guarded here, in one middleware: a changelist
(``/admin/<app>/<model>/``) asked with NUL anywhere in its query string is redirected to itself with
``?e=1``, what the admin answers any lookup it cannot use (the list, unfiltered, flagged as an error).
The console's own pages that read parameters (the usage page, the CSV exports) ask
:func:`query_holds_nul` and answer in their own way.
"""

from __future__ import annotations

import re
from typing import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

__all__ = ["ConsoleQueryMiddleware", "query_holds_nul"]

_CHANGELIST = re.compile(r"^/admin/[^/]+/[^/]+/$")


def query_holds_nul(request: HttpRequest) -> bool:
    """Whether a query parameter's name or value holds NUL."""
    return any("\x00" in key or any("\x00" in value for value in values) for key, values in request.GET.lists())


def _refused(request: HttpRequest) -> HttpResponse | None:
    if request.method in ("GET", "HEAD") and _CHANGELIST.match(request.path) and query_holds_nul(request):
        return HttpResponseRedirect(request.path + "?e=1")
    return None


class ConsoleQueryMiddleware:
    """Sync or async, as the handler it wraps."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if self._async:
            return self.__acall__(request)
        refused = _refused(request)
        if refused is not None:
            return refused
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        refused = _refused(request)
        if refused is not None:
            return refused
        response = self.get_response(request)
        return await response if not isinstance(response, HttpResponse) else response
