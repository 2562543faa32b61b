"""How every control route (gateway_project/urls.py, but the console) answers a method it does not
serve, and why none of them meets CSRF.

A wrong method is 405 with ``Allow`` and the gateway's JSON envelope (``method_not_allowed``, the
data plane's own answer, :func:`inference.errors.method_not_allowed`), checked before the credential
as Django's own method decorators do. OPTIONS is one of those methods (no DRF metadata answer:
nothing documents it). A route serving GET serves HEAD too (Django's rule).

The control plane authenticates with a bearer credential, never a session cookie, so cross-site
request forgery has nothing to ride on: every control view is exempt from Django's CSRF check (DRF
views are, by APIView.as_view; :func:`control_route` makes function views so), while the console,
which does use a session, keeps it.

Two forms of one rule: :class:`ControlPlaneView`, the base of the DRF views (also their
credential and permission), and :func:`control_route`, the decorator of the function views.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions  # type: ignore[import-untyped, unused-ignore]
from rest_framework.response import Response  # type: ignore[import-untyped, unused-ignore]
from rest_framework.views import APIView  # type: ignore[import-untyped, unused-ignore]

from administration.api.auth import ControlPlaneAuthentication, IsControlPlaneAdmin
from administration.api.envelope import envelope_response
from inference import errors

__all__ = ["ControlPlaneView", "control_route", "method_refused", "served_methods"]

View = TypeVar("View", bound=Callable[..., Any])


def served_methods(methods: Iterable[str]) -> tuple[str, ...]:
    """The methods a route answers: those it names, and HEAD with GET."""
    named = tuple(method.upper() for method in methods)
    return (*named, "HEAD") if "GET" in named and "HEAD" not in named else named


def method_refused(request: HttpRequest, allowed: Iterable[str]) -> HttpResponse:
    """405 method_not_allowed in the envelope, with Allow naming what the route serves."""
    return envelope_response(errors.method_not_allowed(request.method or "", request.path, ", ".join(allowed)))


def control_route(*methods: str) -> Callable[[View], View]:
    """A control function view (sync or async) serving ``methods``: any other is refused
    (:func:`method_refused`), and the view is exempt from CSRF."""
    allowed = served_methods(methods)

    def decorate(view: View) -> View:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def served_async(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                if request.method not in allowed:
                    return method_refused(request, allowed)
                answer: HttpResponse = await view(request, *args, **kwargs)
                return answer

            return cast(View, csrf_exempt(served_async))

        @functools.wraps(view)
        def served(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in allowed:
                return method_refused(request, allowed)
            answer: HttpResponse = view(request, *args, **kwargs)
            return answer

        return cast(View, csrf_exempt(served))

    return decorate


class ControlPlaneView(APIView):  # type: ignore[misc, unused-ignore]
    """The base of the control plane's DRF views: control-plane credential and admin role, and a
    wrong method refused like every control route's (before the credential is looked at)."""

    authentication_classes = [ControlPlaneAuthentication]
    permission_classes = [IsControlPlaneAdmin]
    metadata_class = None  # OPTIONS is a method like any other the route does not serve

    @property
    def allowed_methods(self) -> list[str]:
        """What the view serves (Allow): its handlers, HEAD with GET, never OPTIONS."""
        return list(served_methods(method for method in self.http_method_names
                                   if method not in ("options", "head") and hasattr(self, method)))

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        if request.method not in self.allowed_methods:
            raise exceptions.MethodNotAllowed(request.method)
        super().initial(request, *args, **kwargs)

    def handle_exception(self, exc: Exception) -> Response | HttpResponse:  # type: ignore[override]  # 405 envelope
        if isinstance(exc, exceptions.MethodNotAllowed):
            return method_refused(self.request, self.allowed_methods)
        response: Response = super().handle_exception(exc)
        return response
