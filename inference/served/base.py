"""What every served surface shares: the request it serves, the engine worker it runs on (its
client, tokenizer and model family), and the interface the route's attempts loop calls. (A surface
may also be served on external providers, driving the provider itself: Responses with MCP tools.)"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from functools import lru_cache
from random import getrandbits
from typing import Any, Protocol

from inference.accounting import CLEAN, Delivered
from inference.auth import Identity
from inference.dataplane import DataPlane
from inference.kit.account import RequestAccount
from inference.pipeline.tokenizer_registry import TOKENIZERS, tokenizer_for
from inference.pipeline.tokenizers import ModelTokenizer
from inference.routing.pd import pair_context_length, pd_partner
from inference.routing.registry import RegistrySnapshot
from inference.routing.workers import EngineSpec, WorkerHandle, WorkerKind, WorkerRecord
from inference.schemas.families import ModelFamily, detect_family
from inference.pipeline.target import EngineTarget
from inference.upstreams.pd_engine import PdEngineClient, pd_engine_refusal
from inference.writers import ResponseWriter

__all__ = [
    "LocalAnswer", "ServedAnswer", "ServedRequest", "ServedSurface", "engine_target",
    "models_without_tokenizer", "tokenizer_ready", "uuid4_hex",
]  # fmt: skip

# uuid4's version (4) and variant (RFC 4122) bits, as uuid.UUID(version=4) sets them.
_UUID4_KEPT = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def uuid4_hex() -> str:
    """``uuid.uuid4().hex``'s form (32 hex digits, version 4, RFC 4122 variant) for an answer's id,
    from the process's Mersenne Twister as inference.asgi_io.new_request_id draws: an identifier,
    not a secret, and no ``os.urandom`` system call on the request path (D82, D114)."""
    return "%032x" % (getrandbits(128) & _UUID4_KEPT | _UUID4_SET)


class ServedAnswer(Protocol):
    """What :meth:`ServedSurface.open` returns: the attempts loop's answer (status known, nothing
    sent yet), forwarded to the writer or discarded."""

    @property
    def status(self) -> int: ...

    async def forward(self, writer: ResponseWriter) -> Delivered: ...

    async def discard(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """One validated request on its way to an engine worker."""

    dp: DataPlane
    body: dict[str, Any]
    model: str  # the canonical model id ("" when the request named none)
    requested_model: str  # the model as the client sent it (provider profiles match on it)
    stream: bool
    writer: ResponseWriter
    identity: Identity  # who called (surfaces that store per tenant scope their records by it)
    # Open mode only: the caller's own provider key, for an external worker registered without one.
    caller_key: str | None = field(default=None, repr=False)
    parsed: Any = None  # the route validator's own reading of the body (ValidatedRequest.parsed)
    # The client's headers a relay passes on (tracing and routing: inference.api.relay.forwarded_headers),
    # for what the gateway itself sends a provider (the Responses API's provider turns).
    headers: tuple[tuple[str, str], ...] = ()
    # The request's accounting (D66), for a surface whose request goes on after its answer (a
    # background Responses run closes it when the run ends).
    account: RequestAccount | None = field(default=None, repr=False, compare=False)

    def target_of(self, worker: WorkerHandle, model: str) -> EngineTarget:
        """``worker``'s engine target for ``model`` on this request's data plane (a turn's
        :data:`~inference.pipeline.chat_turn.TargetOf`)."""
        return engine_target(self.dp, worker, model)


def _tokenizer_source(record: WorkerRecord, spec: EngineSpec) -> dict[str, str | None]:
    """Where an engine worker's tokenizer comes from (the registry's steps 1 and 4)."""
    return {"location": spec.tokenizer, "chat_template": spec.chat_template, "fallback": record.url}


@lru_cache(maxsize=256)
def _family(model: str, architectures: tuple[str, ...], model_type: str | None) -> ModelFamily | None:
    """:func:`detect_family` once per (model, architectures, model type): every engine request asks."""
    return detect_family(model, architectures=architectures, model_type=model_type)


def engine_target(dp: DataPlane, worker: WorkerHandle, model: str) -> EngineTarget:
    """The client, tokenizer and family of ``worker`` for ``model`` (for the decode worker of a PD
    pair, a client that runs each generation on the pair). Raises GatewayError 503
    tokenizer_not_ready / 500 tokenizer_not_found / 400 runtime_pd_not_supported, or UpstreamFailure
    for a runtime without a client."""
    record = worker.record
    spec = record.engine or EngineSpec()
    model = model or record.model_id or ""
    tokenizer = tokenizer_for(model, **_tokenizer_source(record, spec))
    family = _family(model, tuple(spec.architectures), spec.model_type or None)
    client = dp.engines.client(record)
    client.use_eos_token_ids(tokenizer.eos_token_ids)  # an engine without a tokenizer (ZMQ) needs them
    partner = pd_partner(worker.id)
    if partner is not None:  # a decode worker of a PD pair: the request runs on both engines
        refusal = pd_engine_refusal(record.runtime_type)
        if refusal is not None:
            raise refusal
        client = PdEngineClient(dp.engines.client(partner.handle.record), client, partner, model)
        # A prompt must fit both engines: the smaller context window of the pair is the limit.
        spec = replace(spec, context_length=pair_context_length(partner.context_length, spec.context_length))
    return EngineTarget(worker, client, tokenizer, spec, family, model)


def tokenizer_ready(record: WorkerRecord) -> bool:
    """Whether a request for the worker's model would find its tokenizer (always, for a worker the
    gateway relays to); starts the load when none is under way. In-process state only: never blocks."""
    if record.kind is not WorkerKind.ENGINE:
        return True
    return TOKENIZERS.ready(record.model_id or "", **_tokenizer_source(record, record.engine or EngineSpec()))


def models_without_tokenizer(snapshot: RegistrySnapshot) -> tuple[str, ...]:
    """The models of ready workers whose tokenizer a request would not find yet (each once; a
    worker that serves any model is named by its URL), their loads started (:func:`tokenizer_ready`).
    Ready prefill and decode workers count like regular ones (a gRPC PD pair's requests are
    tokenized by the gateway as any engine worker's are)."""
    waiting: dict[str, None] = {}
    prefills, decodes = snapshot.pd.members(None)
    pd_handles = [member.handle for member in (*prefills, *decodes)]
    for handle in (*snapshot.routable, *pd_handles):
        record = handle.record
        if not tokenizer_ready(record):
            waiting[record.model_id or record.url] = None
    return tuple(waiting)


class ServedSurface(ABC):
    """One request of one surface served on engine workers; :meth:`open` runs per attempt."""

    def __init__(self, request: ServedRequest) -> None:
        self.request = request

    @abstractmethod
    async def open(self, worker: WorkerHandle) -> ServedAnswer:
        """Start the request on ``worker``; return once the engine's first output arrived.
        Raises GatewayError (answered as is) or UpstreamFailure (retried elsewhere)."""


class LocalAnswer:
    """An answer the gateway computed itself without the engine (tokenize, detokenize; a background
    run's queued object, whose request goes on: ``delivered`` :data:`~inference.accounting.LATER`)."""

    __slots__ = ("status", "body", "delivered")

    def __init__(self, body: bytes, status: int = 200, delivered: Delivered = CLEAN) -> None:
        self.status = status
        self.body = body
        self.delivered = delivered

    async def forward(self, writer: ResponseWriter) -> Delivered:
        await writer.whole(self.status, b"application/json", self.body)
        return self.delivered

    async def discard(self) -> None:
        return None
