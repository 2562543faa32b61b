"""GET /v1/models (spec 1, Model list): public; each self-hosted model once, aliases not listed."""

from __future__ import annotations

from inference import errors
from inference.asgi_io import Receive, Scope, Send, request_id_for, send_error, send_json, send_response
from inference.dataplane import data_plane

__all__ = ["list_models"]

_NO_MODELS = b"No models available"


async def list_models(scope: Scope, receive: Receive, send: Send) -> None:
    request_id = request_id_for(scope)
    if scope["method"] not in ("GET", "HEAD"):
        await send_error(send, errors.method_not_allowed(scope["method"], scope["path"], "GET"), request_id)
        return
    models = data_plane().registry.snapshot.routable_models
    if not models:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"x-request-id", request_id)]
        await send_response(send, 503, _NO_MODELS, headers)
        return
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "self_hosted"} for model in models]
    await send_json(send, 200, {"object": "list", "data": data}, request_id)
