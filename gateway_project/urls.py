"""Control-plane URLs served by Django (the data plane is routed in asgi.py before reaching here)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.urls import path

from administration.api.fanout import flush_cache_view, get_loads_view, start_profile_view, stop_profile_view
from administration.api.openapi import SCHEMA_PATH, openapi_view
from administration.api.workers import WorkersView, WorkerView
from gateway_project.escapes import server_error
from inference import errors

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
    path(SCHEMA_PATH.lstrip("/"), openapi_view),
]


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Unknown routes answer with the standard error envelope."""
    error = errors.endpoint_not_found(request.path)
    response = HttpResponse(errors.error_body(error), status=404, content_type="application/json")
    response["X-GW-Error-Code"] = str(error.code)
    return response


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """What Django refuses before a view answers (a SuspiciousOperation): a control-plane body over
    DATA_UPLOAD_MAX_MEMORY_SIZE is 413 payload_too_large, the rest 400, both in the standard envelope."""
    if isinstance(exception, RequestDataTooBig):
        error = errors.payload_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    else:
        error = errors.invalid_request("Bad request")
    response = HttpResponse(errors.error_body(error), status=error.status, content_type="application/json")
    response["X-GW-Error-Code"] = str(error.code)
    return response


handler400 = bad_request
handler404 = not_found
handler500 = server_error
