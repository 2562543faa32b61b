"""The data-plane POST route: authenticate, read and check the body, pick a worker, relay.

Every relayed inference route (chat, completions, embeddings, rerank, generate, ...) is one
:class:`RelayRoute` differing only in its worker path and its validator.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import orjson

from inference import errors
from inference.api.asgi_io import (
    ClientDisconnected,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    header,
    parse_json_object,
    read_body,
    request_id_for,
    send_error,
    send_unauthorized,
)
from inference.backends.base import RelayRequest
from inference.errors import GatewayError
from inference.runtime import runtime
from inference.schemas.base import ValidatedRequest
from inference.routing.selection import select_worker

__all__ = ["RelayRoute", "Validator", "forwarded_headers"]

log = logging.getLogger(__name__)

Validator = Callable[[dict[str, Any]], ValidatedRequest]

# Client headers passed on to HTTP workers (tracing and routing); X-Request-ID is always set.
_FORWARDED = (b"x-correlation-id", b"traceparent", b"tracestate", b"x-gw-routing-key")


def forwarded_headers(scope: Scope) -> tuple[tuple[str, str], ...]:
    found = []
    for key, value in scope["headers"]:
        if key in _FORWARDED or key.startswith(b"x-request-id-"):
            found.append((key.decode("latin-1"), value.decode("latin-1")))
    return tuple(found)


def _model_and_stream(body: dict[str, Any]) -> ValidatedRequest:
    """For routes without a schema: an optional string model, and stream when exactly true."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise errors.invalid_request("model must be a non-empty string", param="model")
    return ValidatedRequest(body=body, model=model or "", stream=body.get("stream") is True, modified=False)


class RelayRoute:
    """A POST route relayed to the same path on the chosen worker."""

    def __init__(self, upstream_path: str, validate: Validator | None = None) -> None:
        self.upstream_path = upstream_path
        self.validate: Validator = validate or _model_and_stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt = runtime()
        request_id = request_id_for(scope)
        try:
            if scope["method"] != "POST":
                raise errors.method_not_allowed(scope["method"], scope["path"], "POST")
            identity = rt.keys.authenticate(header(scope, b"authorization"))
            if identity is None:
                await send_unauthorized(send, request_id)
                return
            scope["gateway.identity"] = identity
            raw = await read_body(scope, receive, rt.config.max_payload_size)
            checked = self.validate(parse_json_object(raw))
            key = header(scope, b"x-gw-routing-key")
            decision = select_worker(
                rt.registry.snapshot, checked.model or None, rt.policies,
                routing_key=key.decode("latin-1") if key else None, body=checked.body,
            )
            body = checked.body
            modified = checked.modified
            if decision.model is not None and decision.model != checked.model:
                body["model"] = decision.model
                modified = True
            payload = orjson.dumps(body) if modified else raw
        except GatewayError as error:
            await send_error(send, error, request_id)
            return
        except ClientDisconnected:
            return
        worker = decision.worker
        request = RelayRequest(
            worker, self.upstream_path, payload, checked.stream, request_id, forwarded_headers(scope), identity
        )
        watch = DisconnectWatch(receive)
        worker.load.in_flight += 1
        try:
            try:
                await rt.backends[worker.record.transport].relay(request, send, watch.stop)
            except GatewayError as error:
                watch.stop()
                await send_error(send, error, request_id)
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            # The client left: the upstream request was closed by the cancellation. Absorb it.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            log.info("client disconnected; upstream request to %s closed", worker.url)
        finally:
            watch.stop()
            worker.load.in_flight -= 1
