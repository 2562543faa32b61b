"""The transport interface: one module per kind of worker, looked up by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from inference.api.asgi_io import Send
from inference.auth import Identity
from inference.routing.registry import WorkerHandle

__all__ = ["RelayRequest", "Backend", "FinalHook"]

FinalHook = Callable[[], None]


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


class Backend(ABC):
    transport: str

    @abstractmethod
    async def relay(self, request: RelayRequest, send: Send, before_final: FinalHook) -> None:
        """Send the request to the worker and the worker's answer to the client.

        Raises GatewayError only before anything was sent to the client. ``before_final`` is called
        right before the last body message goes out.
        """

    async def close(self) -> None:
        """Release long-lived clients (lifespan shutdown)."""

