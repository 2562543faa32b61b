"""The transport interface: one module per kind of worker, looked up by name.

A relay is two steps so the router can retry: ``open`` sends the request and returns once the
worker's status is known (nothing has gone to the client yet); ``forward`` sends the worker's answer
to the client. Either may raise :class:`UpstreamFailure` while nothing was sent to the client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from inference import errors
from inference.api.asgi_io import Send
from inference.auth import Identity
from inference.errors import GatewayError
from inference.routing.registry import WorkerHandle

__all__ = ["RelayRequest", "Upstream", "UpstreamFailure", "Backend", "FinalHook", "StartHook", "StreamObserver"]

FinalHook = Callable[[], None]
# Called with the response-start headers right before they are sent, and the seconds the backend
# spent waiting on the upstream since ``open`` returned (e.g. reading a whole body); it may append.
StartHook = Callable[[list[tuple[bytes, bytes]], float], None]


class StreamObserver(Protocol):
    """Told when a relayed stream's first chunk arrives and when it ends (TTFT, TPOT, duration).

    Times are ``time.perf_counter()`` values; ``events`` counts the SSE data events relayed."""

    def first_chunk(self, at: float) -> None: ...

    def stream_ended(self, first_at: float, ended_at: float, events: int) -> None: ...


@dataclass(frozen=True, slots=True)
class RelayRequest:
    """One request on its way to a worker."""

    worker: WorkerHandle
    path: str  # the worker route, e.g. "/v1/chat/completions"
    body: bytes
    stream: bool
    request_id: bytes
    headers: tuple[tuple[str, str], ...]  # client headers forwarded as they are (tracing, routing key)
    identity: Identity  # who called: shared key, tenant, or anonymous (never the key itself)
    on_start: StartHook | None = None  # the gateway's own response headers (overhead, rate limit)
    observer: StreamObserver | None = None  # stream timings for the router metrics


@dataclass(slots=True)
class Upstream:
    """A worker's answer whose status is known and whose body is not yet read."""

    status: int
    content_type: str
    handle: Any  # the backend's own response object


class UpstreamFailure(Exception):
    """The worker could not be reached, timed out, or broke off before anything reached the client."""

    def __init__(self, kind: str, detail: str, timeout_secs: float = 0.0) -> None:
        super().__init__(detail)
        self.kind = kind  # "connect", "timeout" or "broken"
        self.detail = detail
        self.timeout_secs = timeout_secs

    def to_error(self) -> GatewayError:
        if self.kind == "timeout":
            return errors.upstream_timeout(self.timeout_secs)
        return errors.upstream_unavailable(self.detail)


class Backend(ABC):
    transport: str

    @abstractmethod
    async def open(self, request: RelayRequest) -> Upstream:
        """Send the request; return when the worker's status is known. Raises UpstreamFailure."""

    @abstractmethod
    async def forward(self, upstream: Upstream, request: RelayRequest, send: Send, before_final: FinalHook) -> bool:
        """Send the answer to the client; ``before_final`` runs right before the last body message.

        Returns False when the worker broke off after the response started (reported in-band).
        Raises UpstreamFailure only when nothing was sent to the client.
        """

    @abstractmethod
    async def discard(self, upstream: Upstream) -> None:
        """Drop an answer that will not be forwarded (the request is retried elsewhere)."""

    async def close(self) -> None:
        """Release long-lived clients (lifespan shutdown)."""
