"""What a worker is to the data plane: the closed sets that describe it (status, type, transport,
runtime) and the record, live load and handle the request path reads.

The statuses, types and runtimes are Django ``TextChoices`` because the control plane stores them in
columns of these values (administration.models); the data plane compares them like strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from django.db import models

from inference.routing.breaker import CircuitBreaker, Resilience

__all__ = [
    "WorkerStatus",
    "WorkerType",
    "RuntimeType",
    "normalize_runtime_type",
    "RUNTIME_NAMES",
    "Transport",
    "transport_of",
    "WorkerKind",
    "kind_of",
    "WorkerLoad",
    "WorkerRecord",
    "WorkerHandle",
    "EngineSpec",
    "PdTraits",
    "HttpPool",
    "PROVIDER_HOSTS",
    "provider_of",
]


class WorkerStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    READY = "ready", "Ready"
    NOT_READY = "not_ready", "Not ready"
    DRAINING = "draining", "Draining"
    FAILED = "failed", "Failed"


class WorkerType(models.TextChoices):
    REGULAR = "regular", "Regular"
    PREFILL = "prefill", "Prefill"
    DECODE = "decode", "Decode"
    ENCODE = "encode", "Encode"


class RuntimeType(models.TextChoices):
    SGLANG = "sglang", "SGLang"
    VLLM = "vllm", "vLLM"
    TRTLLM = "trtllm", "TensorRT-LLM"
    MLX = "mlx", "MLX"
    TOKENSPEED = "tokenspeed", "TokenSpeed"
    GENERIC = "generic", "Generic OpenAI-compatible"
    EXTERNAL = "external", "External provider"
    UNSPECIFIED = "unspecified", "Unspecified (auto-detect)"


_ALIASES: dict[str, str] = {
    "engine_a": RuntimeType.SGLANG,
    "engine_b": RuntimeType.VLLM,
    "engine_c": RuntimeType.TRTLLM,
    "tensorrt-llm": RuntimeType.TRTLLM,
    "engine_d": RuntimeType.MLX,
    "engine_e": RuntimeType.TOKENSPEED,
}
# Every name a worker spec may give for its runtime (any letter case): the real ones and the aliases.
RUNTIME_NAMES: tuple[str, ...] = (*RuntimeType.values, *_ALIASES)


def normalize_runtime_type(value: str) -> RuntimeType:
    """The canonical runtime type for a real name or a spec alias. Raises ValueError when unknown."""
    lowered = value.strip().lower()
    return RuntimeType(_ALIASES.get(lowered, lowered))


@dataclass(slots=True)
class WorkerLoad:
    """Mutable live state of one worker, shared by every snapshot that contains it: requests in
    flight, the circuit breaker, and what the load monitor last learned (its load report entries,
    one per data-parallel rank, and whether that report put the worker over its overload thresholds)."""

    in_flight: int = 0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    engine_load: tuple[dict[str, Any], ...] | None = None
    overloaded: bool = False
    # Under --dp-aware (inference/routing/dp_ranks.py): this process's requests in flight per
    # data-parallel rank, and where the next tie between ranks starts.
    rank_in_flight: list[int] = field(default_factory=list)
    rank_turn: int = 0


class Transport(StrEnum):
    """How the gateway talks to a worker, named by its URL's scheme. Asked only where the wire
    itself matters (which engine client, which relay, per-transport counts, the spec's rules that
    name a transport); what the gateway *is* to the worker is its :class:`WorkerKind`."""

    HTTP = "http"
    GRPC = "grpc"
    ZMQ = "zmq"

    @property
    def display_name(self) -> str:
        """The name messages and pages show: HTTP, gRPC, ZMQ."""
        return _DISPLAY_NAMES[self]

    @property
    def carries_engines(self) -> bool:
        """Whether a worker over it is an engine the gateway serves (token ids in and out), rather
        than a server the gateway relays to."""
        return self is not Transport.HTTP


_DISPLAY_NAMES = {Transport.HTTP: "HTTP", Transport.GRPC: "gRPC", Transport.ZMQ: "ZMQ"}


_SCHEME_TRANSPORTS = (("grpc://", Transport.GRPC), ("grpcs://", Transport.GRPC), ("ipc://", Transport.ZMQ))


def transport_of(url: str) -> Transport:
    """The transport a worker URL names: grpc:// and grpcs:// are gRPC, ipc:// ZMQ, anything else HTTP."""
    for scheme, transport in _SCHEME_TRANSPORTS:
        if url.startswith(scheme):
            return transport
    return Transport.HTTP


class WorkerKind(StrEnum):
    """What the gateway is to a worker, the one question every "do we serve it, relay to it, or is
    it a provider" decision asks (docs/DECISIONS.md D62):

    - ``RELAYED``: a self-hosted OpenAI-compatible HTTP server; requests are relayed to it;
    - ``ENGINE``: an engine the gateway serves as the full server (renders, tokenizes, detokenizes),
      whatever its transport (gRPC, ZMQ);
    - ``PROVIDER``: a third-party provider's API (runtime ``external``), never given our keys.
    """

    RELAYED = "relayed"
    ENGINE = "engine"
    PROVIDER = "provider"


def kind_of(url: str, runtime_type: str) -> WorkerKind:
    """The kind of the worker at ``url`` of ``runtime_type`` (a RuntimeType value)."""
    if runtime_type == RuntimeType.EXTERNAL:
        return WorkerKind.PROVIDER
    return WorkerKind.ENGINE if transport_of(url).carries_engines else WorkerKind.RELAYED


PROVIDER_HOSTS: dict[str, str] = {
    "api.openai.com": "openai",
    "api.x.ai": "xai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "gemini",
}
"""Hosts of known providers: a worker URL on one of them registers as an external worker (spec 3)."""


def provider_of(url: str) -> str | None:
    """The provider whose API host ``url`` names, else None."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return PROVIDER_HOSTS.get((host or "").lower())


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the gateway needs to be the server in front of an engine worker (gRPC, ZMQ): where
    its tokenizer and chat template come from, its parsers and its context window. Built once per
    registry change from the worker's model card, labels and the engine's own report (registration
    stores GetModelInfo's answer in the labels), with the flags applied; never read per request
    from the store.

    ``tokenizer`` is the location the operator gave (card tokenizer_path, labels tokenizer_path or
    model_path, or the path the engine reported when it exists on this host); None leaves the
    choice to the tokenizer registry, the flags and the worker's own GetTokenizer."""

    tokenizer: str | None = None
    chat_template: str | None = None
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    context_length: int | None = None
    architectures: tuple[str, ...] = ()
    model_type: str = ""
    # ZMQ workers (ipc://): the engines dialing one socket set, and the handshake address given
    dp_size: int | None = None
    zmq_handshake_address: str | None = None


@dataclass(frozen=True, slots=True)
class PdTraits:
    """What prefill/decode disaggregation needs of a prefill or decode worker (its spec fields and
    labels; inference/routing/pd.py uses them): the KV bootstrap port, the explicit pairing key
    (``pairing_protocol`` label), the KV connector and engine id, the data-parallel size."""

    bootstrap_port: int | None = None
    pairing_protocol: str | None = None
    kv_connector: str | None = None
    kv_engine_id: str | None = None
    dp_size: int | None = None


@dataclass(frozen=True, slots=True)
class HttpPool:
    """A worker's http_pool block (spec 3) with the gateway's defaults filled in, as the HTTP relay
    reads it per request (plain attributes: no lookups on the relay's path; docs/DECISIONS.md D102).

    ``max_idle``: the most idle keep-alive connections kept for the worker's host (more are closed
    as their answers end); ``idle_secs``: how long one may stay idle and still be reused (the block's
    0 is stored as infinity: kept until the worker closes it); ``timeout_secs``: the whole exchange,
    to the last byte of the answer; ``connect_secs``: opening a connection (TCP and TLS)."""

    max_idle: int = 500
    idle_secs: float = 3.0
    timeout_secs: float = 1800.0
    connect_secs: float = 10.0

    @classmethod
    def of(cls, block: dict[str, Any], defaults: HttpPool) -> HttpPool | None:
        """The block over ``defaults`` (the flags'); None when it sets none of the four fields (the
        relay then uses its own defaults, the same flags)."""
        if not any(name in block for name in _HTTP_POOL_FIELDS):
            return None
        idle = float(block.get("pool_idle_timeout_secs", defaults.idle_secs))
        return cls(
            max_idle=int(block.get("pool_max_idle_per_host", defaults.max_idle)),
            idle_secs=idle if idle > 0 else float("inf"),
            timeout_secs=float(block.get("timeout_secs", defaults.timeout_secs)),
            connect_secs=float(block.get("connect_timeout_secs", defaults.connect_secs)),
        )


_HTTP_POOL_FIELDS = ("pool_max_idle_per_host", "pool_idle_timeout_secs", "timeout_secs", "connect_timeout_secs")


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """What the control plane knows about one worker (built from a Worker row)."""

    id: str
    url: str
    model_id: str | None
    runtime_type: str  # a RuntimeType value
    status: WorkerStatus
    api_key: str | None = field(default=None, repr=False)
    resilience: Resilience = field(default_factory=Resilience)
    worker_type: WorkerType = WorkerType.REGULAR
    # Its place in registration order (when it was created, then its URL): the order a full read of
    # the store lists workers in, kept by the registry's deltas too.
    order: tuple[float, str] = (0.0, "")
    engine: EngineSpec | None = None  # set for the workers of kind ENGINE (the control plane builds it)
    # An external provider's models, as its /v1/models listed them at registration (its model_id is
    # empty): the registry routes each of them to it.
    models: tuple[str, ...] = ()
    # The provider an external worker's registration named (--backend, or its ``provider`` label),
    # for a provider's API on a host of its own (a proxy, a stand-in); else its host tells.
    named_provider: str | None = None
    pd: PdTraits | None = None  # set for prefill and decode workers
    # Under --dp-aware, the data-parallel ranks each request is sent to one of (the engine's reported
    # dp_size, when above 1: inference/routing/dp_ranks.py); 0 otherwise.
    dp_ranks: int = 0
    # Its http_pool block with the defaults filled in (HTTP workers: the relay's per-worker pool and
    # timeouts); None: the block sets none of them, the relay's defaults (the flags) apply.
    http_pool: HttpPool | None = None
    # Reached over HTTP/2 with prior knowledge (an http:// relayed worker whose registration chose it:
    # http_pool.http2 true, or found speaking it under --upstream-http2; D111); else HTTP/1.1.
    http2: bool = False
    # Derived once from the URL and the runtime (never given): how the gateway reaches it, and what
    # the gateway is to it.
    transport: Transport = field(init=False, compare=False)
    kind: WorkerKind = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "transport", transport_of(self.url))
        object.__setattr__(self, "kind", kind_of(self.url, self.runtime_type))

    @property
    def served_models(self) -> tuple[str, ...]:
        """The models it is routed for: its one model, or an external provider's list; () for any."""
        if self.models:
            return self.models
        return (self.model_id,) if self.model_id else ()

    @property
    def external(self) -> bool:
        """An external provider (a third-party API): never given the gateway's own keys."""
        return self.kind is WorkerKind.PROVIDER

    @property
    def provider(self) -> str | None:
        """The provider its registration named, else the one a known provider host names (openai,
        anthropic, gemini, xai), else None."""
        return self.named_provider or provider_of(self.url)


@dataclass(frozen=True, slots=True)
class WorkerHandle:
    """A worker as the request path sees it: its record plus its live load, and for one attempt
    under --dp-aware the data-parallel rank the request goes to (inference/routing/dp_ranks.py)."""

    record: WorkerRecord
    load: WorkerLoad
    dp_rank: int | None = None

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def url(self) -> str:
        return self.record.url
