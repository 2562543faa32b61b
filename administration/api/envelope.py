"""A :class:`~inference.errors.GatewayError` as a Django response: the data plane's envelope and
headers, for what a Django route refuses before its own answer (an unknown route, a wrong method, a
refused request, an escaped exception). Light on purpose (no DRF): the logging filter of
gateway_project/escapes.py imports it while settings load."""

from __future__ import annotations

from django.http import HttpResponse

from inference import errors

__all__ = ["envelope_response"]


def envelope_response(error: errors.GatewayError, request_id: str | None = None) -> HttpResponse:
    headers, body = errors.render_json(error, request_id.encode("latin-1") if request_id else None)
    response = HttpResponse(body, status=error.status)
    for name, value in headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    return response
