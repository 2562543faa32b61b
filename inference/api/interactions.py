"""Gemini's Interactions API (spec 1, Endpoints: POST /v1/interactions, "served only by the one
external-provider backend for that API; others 501"; docs ENGINES.md: it is Gemini's).

Relayed only to external workers of the Gemini provider, with the worker's own key (the external
relay: Gemini takes it as a Bearer token) and the client's tracing headers; its stream relayed as it
arrives, closed by Gemini's own ``interaction.complete``. HTTP and engine workers and every other
provider answer 501 ``endpoint_not_supported``.
"""

from __future__ import annotations

from inference.api.surface import Relay, Surface
from inference.writers import INTERACTIONS_SSE

__all__ = ["INTERACTIONS_SURFACES"]

INTERACTIONS_SURFACES = (
    Surface(
        "/v1/interactions", framing=INTERACTIONS_SSE,
        relayed=None, engine=None, provider=Relay(providers=frozenset({"gemini"})),
    ),
)  # fmt: skip
