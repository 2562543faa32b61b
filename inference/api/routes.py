"""The data-plane routes, served by plain async ASGI handlers (no Django view on the request path)."""

from __future__ import annotations

from typing import Any, cast

from django.urls import URLPattern, path

from inference.asgi_io import ASGIApp
from inference.api.worker_routes import engine_metrics, get_model_info, get_server_info, health_generate, loads
from inference.api.anthropic import ANTHROPIC_SURFACES
from inference.api.interactions import INTERACTIONS_SURFACES
from inference.api.models import list_models
from inference.api.openai import OPENAI_SURFACES, RELAYED_PATHS
from inference.api.probes import liveness, readiness
from inference.api.relay import SurfaceRoute

__all__ = ["data_plane_routes", "data_plane_paths", "RELAYED_PATHS", "asgi_route"]


def asgi_route(pattern: str, app: ASGIApp) -> URLPattern:
    """A URL pattern for a raw ASGI app (Channels' URLRouter takes Django patterns)."""
    return path(pattern, cast(Any, app))


def data_plane_routes() -> list[URLPattern]:
    surfaces = (*OPENAI_SURFACES, *ANTHROPIC_SURFACES, *INTERACTIONS_SURFACES)
    routes = [asgi_route(surface.path.lstrip("/"), SurfaceRoute(surface)) for surface in surfaces]
    routes += [
        asgi_route("v1/models", list_models),
        asgi_route("health", liveness),
        asgi_route("liveness", liveness),
        asgi_route("readiness", readiness),
        asgi_route("health_generate", health_generate),
        asgi_route("engine_metrics", engine_metrics),
        asgi_route("loads", loads),
        asgi_route("get_model_info", get_model_info),
        asgi_route("get_server_info", get_server_info),
    ]
    return routes


def data_plane_paths() -> frozenset[str]:
    """The data plane's paths ("/v1/chat/completions", ...), every pattern being a fixed path."""
    return frozenset("/" + str(route.pattern) for route in data_plane_routes())
