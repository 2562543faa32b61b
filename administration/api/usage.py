"""GET /usage, GET /usage/requests and /prices (issue 25, items 4 and 6): DRF adapters over
administration/usage_read.py.

Who may read usage (D71). A control-plane credential (as every control route takes it) sees every
tenant. A tenant key (``--tenant-api-key TENANT:KEY``, the data plane's key ring) may call the two
usage routes too and sees only its own tenant: its answers are filtered on it, and a ``tenant=``
naming another tenant is 403 forbidden (a refusal, not an empty answer, so a client's mistake is not
read as "no usage"). The shared ``--api-key`` counts only as a control-plane credential (with control
plane auth configured it is refused, as on every control route). Prices are control-plane only.

Errors use the general admin body ``{"error": {"message", "type"}}``: 400 bad_request for a query or
body the rules refuse (never a 500), 401 / 403 as every control route, 404 not_found for a model
without prices, 409 conflict for a price from a moment the model already has one.
"""

from __future__ import annotations

from datetime import datetime, timezone as dt_timezone
from typing import Any

import orjson
from django.http import HttpResponse
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response

from administration.api.auth import ControlPlaneAuthentication, IsControlPlaneAdmin
from administration.api.errors import ErrorType, error_body
from administration.api.methods import ControlPlaneView
from administration.control_auth import Principal
from administration.usage_read import (
    PriceConflict,
    UsageQueryError,
    add_price,
    parse_log_query,
    parse_price,
    parse_usage_query,
    price_history,
    price_row,
    prices_in_force,
    request_log,
    usage,
)
from common.config import current_config
from common.secrets import bearer_token, header_bytes
from inference.auth import IdentityKind
from inference.dataplane import data_plane

__all__ = [
    "TenantCaller", "UsageAuthentication", "MayReadUsage", "UsageView", "UsageRequestsView", "PricesView",
    "PriceHistoryView",
]  # fmt: skip


class TenantCaller:
    """A tenant key's holder calling a usage route: sees only ``tenant``."""

    is_authenticated = True

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant

    def __repr__(self) -> str:
        return f"<TenantCaller {self.tenant}>"


class UsageAuthentication(ControlPlaneAuthentication):
    """A tenant key of the data plane's ring (read first: a digest lookup, no JWKS fetch), else the
    control-plane credential as every control route reads it (401 when neither)."""

    def authenticate(self, request: Any) -> tuple[Principal | TenantCaller, None]:  # type: ignore[override]
        ring = data_plane().keys
        if ring.enabled:
            token = bearer_token(header_bytes(request.META.get("HTTP_AUTHORIZATION")))
            identity = ring.find(token) if token is not None else None
            if identity is not None and identity.kind is IdentityKind.TENANT and identity.tenant_id is not None:
                return (TenantCaller(identity.tenant_id), None)
        principal, _ = super().authenticate(request)
        return (principal, None)


class MayReadUsage(IsControlPlaneAdmin):
    """A tenant caller, or a control-plane principal with the admin role."""

    def has_permission(self, request: Any, view: Any) -> bool:
        if isinstance(request.user, TenantCaller):
            return True
        return bool(super().has_permission(request, view))


def _bad_request(message: str) -> Response:
    return Response(error_body(message, ErrorType.BAD_REQUEST), status=400)


class _UsageRouteView(ControlPlaneView):
    def handle_exception(self, exc: Exception) -> Response | HttpResponse:  # type: ignore[override]  # 405 envelope
        if isinstance(exc, UsageQueryError):
            return _bad_request(str(exc))
        if isinstance(exc, PriceConflict):
            return Response(error_body(str(exc), ErrorType.CONFLICT), status=409)
        response: Response | HttpResponse = super().handle_exception(exc)
        return response


def _scoped(request: Request) -> dict[str, str]:
    """The query, with a tenant caller's own tenant put in (403 for another tenant's)."""
    params: dict[str, str] = {name: str(request.query_params.get(name)) for name in request.query_params}
    caller = request.user
    if isinstance(caller, TenantCaller):
        asked = params.get("tenant")
        if asked is not None and asked != caller.tenant:
            raise exceptions.PermissionDenied("a tenant key reads only its own tenant's usage")
        params["tenant"] = caller.tenant
    return params


class UsageView(_UsageRouteView):
    authentication_classes = [UsageAuthentication]
    permission_classes = [MayReadUsage]

    def get(self, request: Request) -> Response:
        query = parse_usage_query(
            _scoped(request), today=datetime.now(dt_timezone.utc).date(), max_days=current_config().usage_max_range_days
        )
        return Response(usage(query))


class UsageRequestsView(_UsageRouteView):
    authentication_classes = [UsageAuthentication]
    permission_classes = [MayReadUsage]

    def get(self, request: Request) -> Response:
        return Response(request_log(parse_log_query(_scoped(request))))


class PricesView(_UsageRouteView):
    def get(self, request: Request) -> Response:
        return Response({"data": prices_in_force()})

    def post(self, request: Request) -> Response:
        try:
            body = orjson.loads(request.body or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            return _bad_request(f"The body is not valid JSON: {exc}")
        now = datetime.now(dt_timezone.utc)
        row = add_price(parse_price(body, now))
        return Response(price_row(row, row.effective_from <= now), status=201)


class PriceHistoryView(_UsageRouteView):
    def get(self, request: Request, model: str) -> Response:
        rows = price_history(model) if "\x00" not in model else []  # no model id holds NUL (Postgres text cannot)
        if not rows:
            return Response(error_body(f"No price for model '{model}'", ErrorType.NOT_FOUND), status=404)
        return Response({"model": model, "data": rows})
