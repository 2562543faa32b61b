"""One descriptor per API surface: what a POST route of the data plane is, and what each kind of
worker does with it.

A :class:`Surface` names its path (the gateway's and the worker's), its validator, its stream
framing (the closing event, and how an error after the response started is reported in-band; an
error before it is always the standard envelope), and, per worker kind
(:class:`~inference.routing.workers.WorkerKind`: relayed, engine, provider), one :data:`Handling`:

- :class:`Relay`: the request goes to the same path on the worker (HTTP workers; external providers
  only those in ``providers`` when it is set), with the client headers of its :class:`HeaderSet`
  (and a provider's whole answer checked by ``whole_answer`` when the surface gives one);
- :class:`Serve`: the gateway serves it itself with a :class:`~inference.served.ServedSurface`
  (engine workers; on external providers, a surface that drives the provider itself, only those in
  ``providers`` when it is set, sending them the client headers of its :class:`HeaderSet`);
- :class:`PerRequest`: one of two handlings, picked per request from the validated request and the
  client's headers (the Messages API on a provider: relayed, or its MCP tool loop run by the gateway);
- ``None``: the worker kind does not serve the route (501 ``endpoint_not_supported``).

Each API's router module lists its surfaces (inference/api/openai.py, responses_api/routes.py, ...);
:class:`~inference.api.relay.SurfaceRoute` runs any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from inference import errors
from inference.auth import Identity, IdentityKind
from inference.kit import Validator
from inference.routing.workers import WorkerKind, WorkerRecord
from inference.schemas.base import ValidatedRequest
from inference.served import ServedSurface
from inference.writers import OPENAI_SSE, Framing

__all__ = [
    "HeaderSet", "OPENAI_HEADERS", "Relay", "Serve", "PerRequest", "Handling", "Surface", "model_and_stream",
]  # fmt: skip


_AUTHORIZATION = b"authorization"


@dataclass(frozen=True, slots=True)
class HeaderSet:
    """The client headers a relayed surface passes on (lower-case names, and prefixes of names);
    X-Request-ID is always set by the gateway, and the worker's own credential by the relay.

    ``credentials`` are the passed names that carry the client's credential for the worker (the
    Messages API's Authorization and x-api-key): a worker registered with a key of its own gets that
    key from the relay instead, and a third party (an external provider) never gets Authorization
    while gateway keys are on, since it then holds one of ours (docs/DECISIONS.md D55)."""

    names: frozenset[bytes]
    prefixes: tuple[bytes, ...] = ()
    credentials: frozenset[bytes] = frozenset()

    def passes(self, name: bytes) -> bool:
        return name in self.names or name.startswith(self.prefixes)

    def for_worker(self, record: WorkerRecord, identity: Identity) -> HeaderSet:
        """This set less the credentials ``record`` must not get from this caller (call it only when
        ``credentials`` is not empty: surfaces without any pass their set as it is)."""
        if record.api_key:
            withheld = self.credentials
        elif record.external and identity.kind is not IdentityKind.ANONYMOUS:
            withheld = self.credentials & {_AUTHORIZATION}
        else:
            return self
        return HeaderSet(self.names - withheld, self.prefixes)


OPENAI_HEADERS = HeaderSet(
    frozenset((b"x-correlation-id", b"traceparent", b"tracestate", b"x-gw-routing-key")), (b"x-request-id-",)
)
"""Tracing and routing headers: what the OpenAI and native surfaces pass on to HTTP workers."""


@dataclass(frozen=True, slots=True)
class Relay:
    """Relayed to the same path on the worker, with ``headers`` of the client's; on external
    workers only to the providers named in ``providers`` (None: any provider). ``whole_answer``, when
    given, reads a provider's whole (non-streamed) success answer before it reaches the client: it
    returns the body to send (a schema's parse and re-serialization) or raises the GatewayError to
    answer instead. An HTTP worker's answer is relayed as it is."""

    headers: HeaderSet = OPENAI_HEADERS
    providers: frozenset[str] | None = None
    whole_answer: Callable[[bytes], bytes] | None = None

    def takes(self, record: WorkerRecord) -> bool:
        return self.providers is None or record.provider in self.providers


@dataclass(frozen=True, slots=True)
class Serve:
    """Served by the gateway with ``surface`` (made once per request, at the first such worker); on
    external workers only for the providers in ``providers`` (None: any provider). ``headers``: the
    client headers the surface may pass on in what it sends a provider (``ServedRequest.headers``),
    its credentials judged per worker as a relay's are."""

    surface: type[ServedSurface]
    headers: HeaderSet = OPENAI_HEADERS
    providers: frozenset[str] | None = None

    def takes(self, record: WorkerRecord) -> bool:
        return self.providers is None or record.provider in self.providers


HeaderLookup = Callable[[bytes], bytes | None]
"""The client's header of a lower-case name (None when absent)."""


@dataclass(frozen=True, slots=True)
class PerRequest:
    """``chosen`` for a request ``wants(request, header)`` says yes to, else ``otherwise``: a choice
    made from the validated request and the client's headers, the same at every worker it is tried on."""

    wants: Callable[[ValidatedRequest, HeaderLookup], bool]
    chosen: Relay | Serve
    otherwise: Relay | Serve

    def pick(self, request: ValidatedRequest, header: HeaderLookup) -> Relay | Serve:
        return self.chosen if self.wants(request, header) else self.otherwise


Handling = Relay | Serve | PerRequest | None


def model_and_stream(body: dict[str, Any]) -> ValidatedRequest:
    """The validator of surfaces without a schema: an optional string model, and stream when
    exactly true."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise errors.invalid_request("model must be a non-empty string", param="model")
    return ValidatedRequest(body=body, model=model or "", stream=body.get("stream") is True, modified=False)


@dataclass(frozen=True, slots=True)
class Surface:
    """One POST route of one API (see the module's docstring)."""

    path: str
    validate: Validator = model_and_stream
    framing: Framing = OPENAI_SSE
    relayed: Handling = Relay()
    engine: Handling = None
    provider: Handling = Relay()
    refuses_epd: bool = False  # 501 on a gRPC EPD deployment (encode workers, no regular one: spec 2)

    def handling(self, kind: WorkerKind) -> Handling:
        if kind is WorkerKind.ENGINE:
            return self.engine
        if kind is WorkerKind.PROVIDER:
            return self.provider
        return self.relayed
