"""The Responses API's data-plane routes, composed into the gateway's router by gateway_project:
POST /v1/responses is one :class:`~inference.api.surface.Surface` (validated here; relayed to an
HTTP worker's own /v1/responses, served by :class:`~responses_api.served.ServedResponses` on engine
workers and on external providers, whose turns it drives), framed as Responses events (no [DONE])."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern

from inference.api.relay import SurfaceRoute
from inference.api.routes import asgi_route
from inference.api.surface import Serve, Surface
from inference.schemas.base import ValidatedRequest
from inference.writers import RESPONSES_SSE
from responses_api.request import validate_response_request
from responses_api.served import ServedResponses

__all__ = ["responses_routes", "validate_responses"]


def validate_responses(body: dict[str, Any]) -> ValidatedRequest:
    checked = validate_response_request(body)
    return ValidatedRequest(body=body, model=checked.model, stream=checked.stream, modified=False, parsed=checked)


RESPONSES = Surface(
    "/v1/responses", validate_responses, RESPONSES_SSE, engine=Serve(ServedResponses), provider=Serve(ServedResponses),
    refuses_epd=True,
)


def responses_routes() -> list[URLPattern]:
    return [
        asgi_route("v1/responses", SurfaceRoute(RESPONSES)),
    ]
