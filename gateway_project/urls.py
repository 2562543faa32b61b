"""Control-plane URLs served by Django (the data plane is routed in asgi.py before reaching here)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.urls import include, path, register_converter

from administration.api.fanout import flush_cache_view, get_loads_view, start_profile_view, stop_profile_view
from administration.api.openapi import SCHEMA_PATH, openapi_view
from administration.api.parse import FunctionCallView, ReasoningView
from administration.api.tokenizers import TokenizersView, TokenizerStatusView, TokenizerView
from administration.api.usage import PriceHistoryView, PricesView, UsageRequestsView, UsageView
from administration.api.workers import WorkersView, WorkerView
from gateway_project.escapes import envelope_response, server_error
from inference import errors

class AnyTextConverter:
    """``<text:...>``: any non-empty text, "/" and line breaks included (``path`` stops at a line
    break, which then answered the router's 404 instead of the route's own)."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(AnyTextConverter, "text")

admin.site.site_header = "Inference gateway"
admin.site.site_title = "Inference gateway"
admin.site.site_url = None  # no public site to link to

urlpatterns = [
    path("admin/", admin.site.urls),
    path("workers", WorkersView.as_view()),
    path("workers/<str:worker_id>", WorkerView.as_view()),
    path("flush_cache", flush_cache_view),
    path("get_loads", get_loads_view),
    path("start_profile", start_profile_view),
    path("stop_profile", stop_profile_view),
    path("parse/function_call", FunctionCallView.as_view()),
    path("parse/reasoning", ReasoningView.as_view()),
    # Usage and spend (a tenant key may read its own), and model prices.
    path("usage", UsageView.as_view()),
    path("usage/requests", UsageRequestsView.as_view()),
    path("prices", PricesView.as_view()),
    path("prices/<text:model>", PriceHistoryView.as_view()),
    # Control-plane routes under /v1 (spec 3): not data-plane paths, so the ASGI router hands them here.
    # A name may hold "/" (a hub id): the status route is matched first.
    path("v1/tokenizers", TokenizersView.as_view()),
    path("v1/tokenizers/<text:tokenizer_id>/status", TokenizerStatusView.as_view()),
    path("v1/tokenizers/<text:tokenizer_id>", TokenizerView.as_view()),
    path(SCHEMA_PATH.lstrip("/"), openapi_view),
    # The Conversations API (spec 2): client routes, authenticated with the data plane's keys.
    path("v1/", include("responses_api.urls")),
]


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Unknown routes answer with the standard error envelope."""
    return envelope_response(errors.endpoint_not_found(request.path))


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """What Django refuses before a view answers (a SuspiciousOperation): a control-plane body over
    DATA_UPLOAD_MAX_MEMORY_SIZE is 413 payload_too_large, the rest 400, both in the standard envelope."""
    if isinstance(exception, RequestDataTooBig):
        error = errors.payload_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    else:
        error = errors.invalid_request("Bad request")
    return envelope_response(error)


handler400 = bad_request
handler404 = not_found
handler500 = server_error
