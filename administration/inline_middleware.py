"""Django's own middleware whose hooks do no I/O (security headers, common checks, CSRF, frame
options), run on the event loop under ASGI instead of one thread hop per hook.

Django's ``MiddlewareMixin`` runs each sync hook of an async request through ``sync_to_async``
(a hand-over to the request's own thread and back): POST /workers passed 17 such hops, about 85 us
of CPU each plus the thread made for the request (D109). These four classes' hooks only read the
request and settings and set headers (no store, no session, no file), so they are called in place:
the same hooks, in the same order, with the same arguments; only the thread differs. Under WSGI (the
sync test client) each is Django's own class, unchanged. The sessions, authentication and messages
middleware stay Django's (their hooks may read the store).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptions
from django.middleware.common import CommonMiddleware as _Common
from django.middleware.csrf import CsrfViewMiddleware as _Csrf
from django.middleware.security import SecurityMiddleware as _Security
from django.utils.deprecation import MiddlewareMixin

__all__ = ["SecurityMiddleware", "CommonMiddleware", "CsrfViewMiddleware", "XFrameOptionsMiddleware"]

_Handler = Callable[[HttpRequest], Any]


class _Inline:
    """Django's middleware ``wrapped``, its hooks called in place when the request is async."""

    wrapped: type[MiddlewareMixin]
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: _Handler) -> None:
        self.inner = self.wrapped(get_response)
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        view_hook = getattr(self.inner, "process_view", None)
        if view_hook is not None:  # the handler calls it before the view: in place too when async
            self.process_view = self._aprocess_view if self.is_async else view_hook

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if self.is_async:
            return self.__acall__(request)
        return self.inner(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        inner: Any = self.inner
        response = inner.process_request(request) if hasattr(inner, "process_request") else None
        response = response or await self.get_response(request)
        if hasattr(inner, "process_response"):
            response = inner.process_response(request, response)
        return response

    async def _aprocess_view(self, request: HttpRequest, view: Any, args: Any, kwargs: Any) -> Any:
        return self.inner.process_view(request, view, args, kwargs)  # type: ignore[attr-defined]


class SecurityMiddleware(_Inline):
    wrapped = _Security


class CommonMiddleware(_Inline):
    wrapped = _Common


class CsrfViewMiddleware(_Inline):
    wrapped = _Csrf


class XFrameOptionsMiddleware(_Inline):
    wrapped = _XFrameOptions
