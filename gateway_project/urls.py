"""Control-plane URLs served by Django (the data plane is routed in asgi.py before reaching here)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path

from administration.api.fanout import flush_cache_view, get_loads_view, start_profile_view, stop_profile_view
from administration.api.workers import WorkersView, WorkerView
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
]


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Unknown routes answer with the standard error envelope."""
    error = errors.endpoint_not_found(request.path)
    response = HttpResponse(errors.error_body(error), status=404, content_type="application/json")
    response["X-GW-Error-Code"] = str(error.code)
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    error = errors.internal_error()
    response = HttpResponse(errors.error_body(error), status=500, content_type="application/json")
    response["X-GW-Error-Code"] = str(error.code)
    return response


handler404 = not_found
handler500 = server_error
