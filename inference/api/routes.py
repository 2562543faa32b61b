"""The data-plane routes, served by plain async ASGI handlers (no Django view on the request path)."""

from __future__ import annotations

from typing import Any, cast

from django.urls import URLPattern, path

from inference.asgi_io import ASGIApp
from inference.api.worker_routes import engine_metrics, get_model_info, get_server_info, health_generate, loads
from inference.api.models import list_models
from inference.api.probes import liveness, readiness
from inference.api.relay import RelayRoute
from inference.schemas.chat import validate_chat_completion
from inference.schemas.completions import validate_completion
from inference.served import ServedSurface
from inference.served.chat import ServedChat
from inference.served.completions import ServedCompletion
from inference.served.embeddings import ServedEmbeddings
from inference.served.generate import ServedGenerate
from inference.served.tokenize import ServedDetokenize, ServedTokenize

__all__ = ["data_plane_routes", "data_plane_paths", "RELAYED_PATHS"]

# Worker path per relayed route (the gateway path and the worker path are the same).
RELAYED_PATHS = (
    "/v1/embeddings",
    "/v1/rerank",
    "/rerank",
    "/v1/classify",
    "/generate",
    "/v1/tokenize",
    "/v1/detokenize",
)


# What the gateway serves itself on engine (gRPC) workers, per relayed route; the others answer 501
# there.
SERVED_PATHS: dict[str, type[ServedSurface]] = {
    "/v1/embeddings": ServedEmbeddings,
    "/generate": ServedGenerate,
    "/v1/tokenize": ServedTokenize,
    "/v1/detokenize": ServedDetokenize,
}


def asgi_route(pattern: str, app: ASGIApp) -> URLPattern:
    """A URL pattern for a raw ASGI app (Channels' URLRouter takes Django patterns)."""
    return path(pattern, cast(Any, app))


def data_plane_routes() -> list[URLPattern]:
    routes = [
        asgi_route(
            "v1/chat/completions", RelayRoute("/v1/chat/completions", validate_chat_completion, served=ServedChat)
        ),
        asgi_route("v1/completions", RelayRoute("/v1/completions", validate_completion, served=ServedCompletion)),
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
    routes.extend(
        asgi_route(route.lstrip("/"), RelayRoute(route, served=SERVED_PATHS.get(route))) for route in RELAYED_PATHS
    )
    return routes


def data_plane_paths() -> frozenset[str]:
    """The data plane's paths ("/v1/chat/completions", ...), every pattern being a fixed path."""
    return frozenset("/" + str(route.pattern) for route in data_plane_routes())
