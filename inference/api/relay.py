"""The data-plane POST route: authenticate, read and check the body, pick a worker, relay.

Every relayed inference route (chat, completions, embeddings, rerank, generate, ...) is one
:class:`RelayRoute` differing only in its worker path and its validator.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable

import orjson

from administration import metrics
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
from inference.backends.base import RelayRequest, StreamObserver, UpstreamFailure
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
        clock = ResponseClock(perf_counter())
        rt = runtime()
        request_id = request_id_for(scope)
        media_bytes = 0
        try:
            if scope["method"] != "POST":
                raise errors.method_not_allowed(scope["method"], scope["path"], "POST")
            identity = rt.keys.authenticate(header(scope, b"authorization"))
            if identity is None:
                await send_unauthorized(send, request_id)
                return
            scope["gateway.identity"] = identity
            if rt.rate_limiter is not None and identity.tenant_id is not None and identity.kind == "tenant":
                limited = await rt.rate_limiter.hit(identity.tenant_id)
                if limited is not None:
                    metrics.record_rate_limit(limited.allowed)
                    if not limited.allowed:
                        raise errors.rate_limit_exceeded(limited.headers())
                    clock.headers = limited.headers()
            raw = await read_body(scope, receive, rt.config.max_payload_size)
            checked = self.validate(parse_json_object(raw))
            if rt.media is not None:
                media_bytes = rt.media.measure(checked.body)
        except GatewayError as error:
            await send_error(send, error, request_id)
            return
        except ClientDisconnected:
            return
        route = metrics.RouteTimer(self.upstream_path, checked.model, checked.stream, clock.started)
        watch = DisconnectWatch(receive)
        permits, media = rt.permits, rt.media
        held_permit = False
        held_media = False
        try:
            try:
                if permits is not None:
                    await permits.acquire()
                    held_permit = True
                if media_bytes and media is not None:
                    await media.reserve(media_bytes)
                    held_media = True
                attempt, worker, policy = self._prepare(
                    rt, scope, checked, raw, request_id, identity, clock, route if checked.stream else None
                )
                route.selected(worker.record.worker_type, policy)
                await self._dispatch(rt, attempt, worker, send, watch)
                route.finished()
            except GatewayError as error:
                watch.stop()
                route.failed(str(error.code), error.status)
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
            if held_permit and permits is not None:
                permits.release()
            if held_media and media is not None:
                media.release(media_bytes)

    def _prepare(
        self, rt: Runtime, scope: Scope, checked: ValidatedRequest, raw: bytes, request_id: bytes,
        identity: Identity, clock: ResponseClock, observer: StreamObserver | None,
    ) -> tuple[Attempt, WorkerHandle, str]:
        """Pick the worker and build what stays the same across retries."""
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
        attempt = Attempt(
            model=checked.model or None,
            routing_key=routing_key,
            body=checked.body,
            payload=orjson.dumps(body) if modified else raw,
            stream=checked.stream,
            request_id=request_id,
            headers=forwarded_headers(scope),
            identity=identity,
            clock=clock,
            observer=observer,
        )
        return attempt, decision.worker, decision.policy

    async def _dispatch(self, rt: Runtime, attempt: Attempt, worker: WorkerHandle, send: Send, watch: DisconnectWatch) -> None:
        """Send to ``worker``; on a retryable outcome and while nothing reached the client, try the
        next worker the policy picks (never one already tried) after a backoff."""
        tried: list[str] = []
        retries = 0
        while True:
            if retries:  # back off before the next attempt, holding no worker's in-flight slot
                backoff = rt.retry.backoff_secs(retries)
                metrics.record_retry(worker.record.worker_type, self.upstream_path, retries, backoff)
                await asyncio.sleep(backoff)
            tried.append(worker.id)
            breaker = worker.load.breaker
            backend = rt.backends.get(worker.record.transport)
            if backend is None:  # a transport this gateway does not speak yet (registration refuses them)
                raise errors.endpoint_not_supported(self.upstream_path, worker.record.transport)
            request = attempt.request_for(worker, self.upstream_path)
            worker.load.in_flight += 1
            try:
                try:
                    opening = perf_counter()
                    try:
                        upstream = await backend.open(request)
                    finally:
                        attempt.clock.upstream_secs += perf_counter() - opening
                    metrics.record_upstream_status(upstream.status)
                    if upstream.status in RETRY_STATUSES:
                        following = self._next_worker(rt, attempt, tried, retries)
                        if following is None:
                            metrics.record_retries_exhausted(worker.record.worker_type, self.upstream_path)
                        else:
                            failed = breaker.config.counts_as_failure(upstream.status)
                            metrics.record_breaker_outcome(worker.url, failed)
                            breaker.record(failed)
                            await backend.discard(upstream)
                            log.info("worker %s answered %d; retrying on %s", worker.url, upstream.status, following.url)
                            worker, retries = following, retries + 1
                            continue
                    clean = await backend.forward(upstream, request, send, watch.stop)
                    failed = not clean or breaker.config.counts_as_failure(upstream.status)
                    metrics.record_breaker_outcome(worker.url, failed)
                    breaker.record(failed)
                    return
                except UpstreamFailure as failure:
                    metrics.record_worker_error(worker.record.worker_type, failure.kind == "timeout")
                    metrics.record_breaker_outcome(worker.url, True)
                    breaker.record(True)
                    following = self._next_worker(rt, attempt, tried, retries)
                    if following is None:
                        metrics.record_retries_exhausted(worker.record.worker_type, self.upstream_path)
                        raise failure.to_error() from None
                    log.info("worker %s failed (%s); retrying on %s", worker.url, failure.detail, following.url)
                    worker, retries = following, retries + 1
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
    clock: ResponseClock
    observer: StreamObserver | None

    def request_for(self, worker: WorkerHandle, path: str) -> RelayRequest:
        return RelayRequest(
            worker, path, self.payload, self.stream, self.request_id, self.headers, self.identity,
            self.clock.on_start, self.observer,
        )


class ResponseClock:
    """Times one request for ``x-gw-overhead-ms`` (time in the gateway minus time waiting on the
    upstream, up to the response start) and carries the other gateway headers for the response."""

    __slots__ = ("started", "upstream_secs", "headers")

    def __init__(self, started: float) -> None:
        self.started = started
        self.upstream_secs = 0.0
        self.headers: tuple[tuple[bytes, bytes], ...] = ()

    def on_start(self, headers: list[tuple[bytes, bytes]], upstream_secs: float) -> None:
        overhead = perf_counter() - self.started - self.upstream_secs - upstream_secs
        headers.append((b"x-gw-overhead-ms", b"%.3f" % (max(overhead, 0.0) * 1000.0)))
        if self.headers:
            headers.extend(self.headers)
