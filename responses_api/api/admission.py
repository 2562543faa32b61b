"""What every client route of the history store passes before its view (spec 2: /v1/conversations and
its items, /v1/responses/{id}, its cancel and input_items): the caller's tenant rate limit, and the
store-outage answer.

One middleware (settings.MIDDLEWARE) for every route of ``responses_api/urls.py``, recognised by that
URLconf's namespace (:data:`CLIENT_STORE_ROUTES`), so a route added there is guarded without a line of
its own. POST /v1/responses never comes here: the data plane's gate admits it.

- **Tenant rate limit**: the data plane's limiter, so a tenant has one budget for its inference and
  its store requests (spec 1, Authentication and Limits). Over it: 429 with Retry-After and
  X-RateLimit-*; an allowed answer carries X-RateLimit-* as well.
- **Store outage**: while the store is known down (:data:`common.outages.STORE`) and the history
  lives in it (``--history-backend db``), 503 with Retry-After at once, without waiting for a
  pooled connection, except one request per ``STORE.retry_secs``, which goes to its view and so
  tries the store (the store reports the outage's end, or its continuation).

A caller without a valid key passes through to its view, which answers the spec's 401. Refusals are
in the route family's format (:func:`responses_api.api.errors.refusal`).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from common import telemetry
from common.outages import STORE
from common.secrets import header_bytes
from inference import errors
from inference.dataplane import data_plane
from responses_api.api.errors import refusal, store_unavailable
from responses_api.storage import history_store

__all__ = ["CLIENT_STORE_ROUTES", "ClientStoreAdmission"]

CLIENT_STORE_ROUTES = "client_store"
"""The URL namespace (``app_name``) of responses_api/urls.py: every route in it is guarded here."""

_RATE_HEADERS = "gateway_rate_headers"  # request attribute: an allowed request's X-RateLimit-* headers


class ClientStoreAdmission:
    """The middleware; see the module's docstring."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        response = await self.get_response(request)
        for name, value in getattr(request, _RATE_HEADERS, ()):
            response[name.decode("latin-1")] = value.decode("latin-1")
        return response

    async def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> HttpResponse | None:
        match = request.resolver_match
        if match is None or CLIENT_STORE_ROUTES not in match.namespaces:
            return None
        dp = data_plane()
        identity = dp.keys.authenticate(header_bytes(request.META.get("HTTP_AUTHORIZATION")))
        if identity is None:
            return None  # the view answers 401
        limiter, tenant = dp.rate_limiter, identity.rate_limited_tenant
        if limiter is not None and tenant is not None:
            decision = await limiter.hit(tenant)
            if decision is not None:
                telemetry.record_rate_limit(decision.allowed)
                if not decision.allowed:
                    return refusal(request.path, errors.rate_limit_exceeded(decision.headers()))
                setattr(request, _RATE_HEADERS, decision.headers())
        if STORE.down and history_store().in_database and not STORE.retry_due():
            return refusal(request.path, store_unavailable())
        return None
