"""The data-plane POST route: authenticate, read and check the body, pick a worker, relay.

Every relayed inference route (chat, completions, embeddings, rerank, generate, ...) is one
:class:`RelayRoute` differing only in its worker path and its validator.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
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
from inference.auth import Identity
from inference.backends.base import RelayRequest, UpstreamFailure
from inference.errors import GatewayError
from inference.routing.registry import WorkerHandle
from inference.routing.retry import RETRY_STATUSES
from inference.runtime import Runtime, runtime
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
            routing_key = key.decode("latin-1") if key else None
            decision = select_worker(
                rt.registry.snapshot, checked.model or None, rt.policies, routing_key=routing_key, body=checked.body
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
        attempt = Attempt(
            model=checked.model or None,
            routing_key=routing_key,
            body=checked.body,
            payload=payload,
            stream=checked.stream,
            request_id=request_id,
            headers=forwarded_headers(scope),
            identity=identity,
        )
        watch = DisconnectWatch(receive)
        try:
            try:
                await self._dispatch(rt, attempt, decision.worker, send, watch)
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
            log.info("client disconnected; upstream request closed (request %s)", request_id.decode())
        finally:
            watch.stop()

    async def _dispatch(self, rt: Runtime, attempt: Attempt, worker: WorkerHandle, send: Send, watch: DisconnectWatch) -> None:
        """Send to ``worker``; on a retryable outcome and while nothing reached the client, try the
        next worker the policy picks (never one already tried) after a backoff."""
        tried: list[str] = []
        retries = 0
        while True:
            tried.append(worker.id)
            breaker = worker.load.breaker
            backend = rt.backends[worker.record.transport]
            request = attempt.request_for(worker, self.upstream_path)
            worker.load.in_flight += 1
            try:
                try:
                    upstream = await backend.open(request)
                    if upstream.status in RETRY_STATUSES:
                        following = self._next_worker(rt, attempt, tried, retries)
                        if following is not None:
                            breaker.record_status(upstream.status)
                            await backend.discard(upstream)
                            log.info("worker %s answered %d; retrying on %s", worker.url, upstream.status, following.url)
                            worker, retries = following, retries + 1
                            await asyncio.sleep(rt.retry.backoff_secs(retries))
                            continue
                    clean = await backend.forward(upstream, request, send, watch.stop)
                    breaker.record(not clean or breaker.config.counts_as_failure(upstream.status))
                    return
                except UpstreamFailure as failure:
                    breaker.record(True)
                    following = self._next_worker(rt, attempt, tried, retries)
                    if following is None:
                        raise failure.to_error() from None
                    log.info("worker %s failed (%s); retrying on %s", worker.url, failure.detail, following.url)
                    worker, retries = following, retries + 1
                    await asyncio.sleep(rt.retry.backoff_secs(retries))
            finally:
                request.worker.load.in_flight -= 1  # the worker of this attempt

    def _next_worker(self, rt: Runtime, attempt: Attempt, tried: list[str], retries: int) -> WorkerHandle | None:
        if not rt.retry.allows(retries, len(attempt.payload)):
            return None
        try:
            return select_worker(
                rt.registry.snapshot, attempt.model, rt.policies,
                routing_key=attempt.routing_key, body=attempt.body, exclude=frozenset(tried),
            ).worker
        except GatewayError:
            return None


@dataclass(frozen=True, slots=True)
class Attempt:
    """What stays the same across retries of one request."""

    model: str | None
    routing_key: str | None
    body: dict[str, Any]
    payload: bytes
    stream: bool
    request_id: bytes
    headers: tuple[tuple[str, str], ...]
    identity: Identity

    def request_for(self, worker: WorkerHandle, path: str) -> RelayRequest:
        return RelayRequest(worker, path, self.payload, self.stream, self.request_id, self.headers, self.identity)
