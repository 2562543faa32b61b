"""Relays: upstreams that already speak the client's API (HTTP workers, external providers; HTTP PD
and WebSocket later). One module per kind, registered by name (a transport, or ``external``) with
``@RELAYS.register(...)``.

A relay is two steps so the attempts loop can retry: :meth:`Relay.open` sends the request and returns
once the worker's status is known (nothing has gone to the client yet); :meth:`RelayAnswer.forward`
hands the answer to the surface's :class:`~inference.writers.ResponseWriter`, which owns headers and
framing. Either may raise :class:`~inference.upstreams.failures.UpstreamFailure` while nothing was
sent to the client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import AsyncIterator, ClassVar

from common.config import GatewayConfig
from inference.accounting import Delivered
from inference.auth import Identity
from inference.routing.workers import Transport, WorkerHandle
from inference.upstreams.registry import NamedRegistry
from inference.writers import ResponseWriter

__all__ = ["RelayRequest", "RelayAnswer", "Relay", "RELAYS"]


@dataclass(slots=True)  # not frozen: a frozen __init__ sets each field through object.__setattr__ (D86)
class RelayRequest:
    """One request on its way to a worker (never changed once made)."""

    worker: WorkerHandle
    path: str  # the worker route, e.g. "/v1/chat/completions"
    body: bytes
    stream: bool
    request_id: bytes
    headers: tuple[tuple[str, str], ...]  # client headers forwarded as they are (tracing, routing key)
    identity: Identity  # who called: shared key, tenant, or anonymous (never the key itself)
    # Open mode only, to an external worker registered without a key: the caller's own provider key.
    caller_key: str | None = field(default=None, repr=False)
    # The gateway added stream_options.include_usage the client did not ask for (to account the
    # request): the worker's usage-only event is read and not passed on (docs/DECISIONS.md D66).
    added_usage: bool = False


class RelayAnswer(ABC):
    """A worker's answer whose status is known and whose body is not yet read."""

    __slots__ = ("status", "content_type")

    def __init__(self, status: int, content_type: str) -> None:
        self.status = status
        self.content_type = content_type

    @abstractmethod
    async def forward(self, writer: ResponseWriter) -> Delivered:
        """Hand the answer to the client through ``writer``.

        Returns what it came to: not ``clean`` when the worker broke off after the response started
        (the writer reported it in-band), and the usage the answer reported. Raises UpstreamFailure
        only when nothing was sent to the client.
        """

    @abstractmethod
    async def discard(self) -> None:
        """Drop an answer that will not be forwarded (the request is retried elsewhere)."""

    def chunks(self) -> AsyncIterator[bytes]:
        """The answer's body as it arrives, for a surface that reads it itself instead of forwarding
        it (the gateway driving an external provider). Raises UpstreamFailure when the upstream
        breaks off or times out; closing the iterator early drops the upstream connection."""
        raise NotImplementedError(f"{type(self).__name__} cannot be read by the gateway")


class Relay(ABC):
    """One per process and transport; holds the long-lived clients of that transport."""

    transport: ClassVar[Transport]

    @classmethod
    @abstractmethod
    def from_config(cls, config: GatewayConfig) -> Relay:
        """The relay with the gateway's flags applied (built once per process)."""

    @abstractmethod
    async def open(self, request: RelayRequest) -> RelayAnswer:
        """Send the request; return when the worker's status is known. Raises UpstreamFailure."""

    async def close(self) -> None:
        """Release long-lived clients (lifespan shutdown)."""


RELAYS: NamedRegistry[Relay] = NamedRegistry("relay")
