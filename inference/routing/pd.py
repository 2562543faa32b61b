"""Prefill/decode disaggregation on the routing side: which prefill and decode workers may serve a
request together, the pair a request gets, and the bootstrap fields that let the two meet.

A PD pool is built once per registry change (never per request): each prefill and decode worker as
a :class:`PdMember`, its handle with its :class:`PdTraits` (bootstrap port, pairing key, KV
connector). The request path calls :func:`select_pair` and :func:`inject_bootstrap`.

Pairing (spec 3): a prefill and a decode worker pair only when their ``pd_pairing`` keys are equal:
the ``pairing_protocol`` label when the worker has one, else ``runtime/transport/layout`` (layout:
``dpN`` for a worker of dp_size N, ``single`` without one; the value the admin API shows as
``pd_pairing``), so an SGLang prefill is never paired with a vLLM decode, nor a gRPC prefill with
an HTTP decode.
"""

from __future__ import annotations

import random
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from common import pd_metrics
from common.config import current_config
from inference import errors
from inference.routing.breaker import BreakerState
from inference.routing.workers import PdTraits, WorkerHandle, WorkerKind, WorkerRecord, WorkerStatus, WorkerType

if TYPE_CHECKING:  # the policies package imports the registry, which imports this module
    from inference.routing.policies.base import SelectionPolicy, SelectionRequest

__all__ = [
    "GRPC_DEFAULT_BOOTSTRAP_PORT",
    "MAX_HTTP_ROOM",
    "MAX_GRPC_ROOM",
    "PdTraits",
    "PdMember",
    "PdPair",
    "pd_pairing",
    "pairing_key",
    "bootstrap_host",
    "pair_context_length",
    "select_pair",
    "http_room",
    "grpc_room",
    "inject_bootstrap",
    "require_bootstrap_host",
    "batch_size",
    "PdPool",
    "build_pd_pool",
    "choose_partner",
    "pd_partner",
]

GRPC_DEFAULT_BOOTSTRAP_PORT = 8998  # sent on gRPC (and the Mooncake-style path) when bootstrap_port is unset
MAX_HTTP_ROOM = 2**63 - 1  # a room id is random in [0, 2^63 - 1] (as SGLang's own router draws it)
MAX_GRPC_ROOM = 2**31 - 2  # SGLang's DisaggregatedParams.bootstrap_room is an int32: [0, i32::MAX)
_random = random.SystemRandom()


def pd_pairing(record: WorkerRecord, traits: PdTraits) -> str:
    """The worker's pairing key, shown as ``pd_pairing`` (spec 3): ``pairing_protocol`` when set,
    else ``runtime/transport/layout``."""
    return pairing_key(record.runtime_type, record.transport.value, traits)


def pairing_key(runtime_type: str, transport: str, traits: PdTraits) -> str:
    """:func:`pd_pairing` from a worker's runtime type, transport name and traits (the admin API and
    the console compute it from the stored row with this, so both show what routing pairs by)."""
    if traits.pairing_protocol:
        return traits.pairing_protocol
    layout = f"dp{traits.dp_size}" if traits.dp_size else "single"
    return f"{runtime_type}/{transport}/{layout}"


def bootstrap_host(record: WorkerRecord) -> str:
    """The host a decode worker reaches the prefill worker's bootstrap server on: its URL's host."""
    from urllib.parse import urlsplit  # noqa: PLC0415 - once per pool build, not per request

    host = urlsplit(record.url).hostname
    return host or ""


@dataclass(frozen=True, slots=True)
class PdMember:
    """A prefill or decode worker of the pool, with what is derived from it once."""

    handle: WorkerHandle
    traits: PdTraits
    pairing: str  # pd_pairing(record, traits)
    host: str  # bootstrap_host(record)
    context_length: int | None = None  # its context window when known

    @classmethod
    def of(cls, handle: WorkerHandle, traits: PdTraits, context_length: int | None = None) -> PdMember:
        record = handle.record
        if context_length is None and record.engine is not None:
            context_length = record.engine.context_length
        return cls(handle, traits, pd_pairing(record, traits), bootstrap_host(record), context_length)


@dataclass(frozen=True, slots=True)
class PdPair:
    prefill: PdMember
    decode: PdMember

    @property
    def context_length(self) -> int | None:
        """The smaller context window of the two: what a request's length is checked against."""
        return pair_context_length(self.prefill.context_length, self.decode.context_length)


def pair_context_length(prefill: int | None, decode: int | None) -> int | None:
    """The smaller of two context windows; one side's when the other is unknown."""
    if prefill is None:
        return decode
    if decode is None:
        return prefill
    return min(prefill, decode)


def _usable(members: Sequence[PdMember], exclude: frozenset[str], now: float) -> tuple[list[PdMember], list[PdMember]]:
    """The members that may take the request, and those that may but for overload protection (not
    tried, breaker letting traffic through, the load monitor's last report over their thresholds)."""
    usable: list[PdMember] = []
    overloaded: list[PdMember] = []
    for member in members:
        load = member.handle.load
        if member.handle.id in exclude:
            continue
        if load.breaker.state is BreakerState.CLOSED or load.breaker.allows(now):
            (overloaded if load.overloaded else usable).append(member)
    return usable, overloaded


def select_pair(
    prefills: Sequence[PdMember],
    decodes: Sequence[PdMember],
    model: str | None,
    prefill_policy: SelectionPolicy,
    decode_policy: SelectionPolicy,
    request: SelectionRequest,
    exclude: frozenset[str] = frozenset(),
) -> PdPair:
    """The (prefill, decode) pair for a request: the prefill chosen by ``prefill_policy`` among the
    usable prefill workers that have a usable decode worker with the same pairing key, then the
    decode by ``decode_policy`` among those.

    Raises 503 worker_overload_protection_shed (Retry-After: the load-monitor interval) when a pair
    could take the request but for overload protection on either side (what PD admission waits on:
    :func:`inference.kit.pd_route.admit_pair`), else 503 no_prefill_servers when no prefill worker
    can take the request, 503 no_healthy_workers when prefill workers can but no decode worker pairs
    with any of them.
    """
    now = time.monotonic()
    usable_prefills, overloaded_prefills = _usable(prefills, exclude, now)
    usable_decodes, overloaded_decodes = _usable(decodes, exclude, now)
    keys = {member.pairing for member in usable_decodes}
    pairable = [member for member in usable_prefills if member.pairing in keys]
    if not pairable:
        if overloaded_prefills or overloaded_decodes:
            held_keys = keys | {member.pairing for member in overloaded_decodes}
            if any(member.pairing in held_keys for member in (*usable_prefills, *overloaded_prefills)):
                raise errors.worker_overload_shed(current_config().load_monitor_interval)
        if not usable_prefills:
            raise errors.no_prefill_servers()
        raise errors.no_healthy_workers(model)
    by_handle = {member.handle.id: member for member in pairable}
    prefill = by_handle[prefill_policy.select([member.handle for member in pairable], request).id]
    partners = {member.handle.id: member for member in usable_decodes if member.pairing == prefill.pairing}
    decode = partners[decode_policy.select([member.handle for member in partners.values()], request).id]
    return PdPair(prefill, decode)


def http_room() -> int:
    """A bootstrap room for an HTTP PD request: random in [0, 2^63 - 1]."""
    return _random.randint(0, MAX_HTTP_ROOM)


def grpc_room() -> int:
    """A bootstrap room for a gRPC PD request (SGLang's int32 field): random in [0, 2^31 - 2]."""
    return _random.randint(0, MAX_GRPC_ROOM)


def require_bootstrap_host(prefill: PdMember) -> str:
    """The prefill worker's bootstrap host. A worker whose URL names no host gives the decode engine
    nowhere to meet it: nothing is sent, the request ends with 500 and counts in
    gw_pd_bootstrap_failures_total (as the reference counts a bootstrap it could not inject)."""
    if not prefill.host:
        pd_metrics.PD_BOOTSTRAP_FAILURES.inc()
        raise errors.internal_error(
            f"PD bootstrap failed: no bootstrap host can be derived from prefill worker URL {prefill.handle.url!r}"
        )
    return prefill.host


def inject_bootstrap(body: Mapping[str, Any], prefill: PdMember, batch_size: int | None = None) -> dict[str, Any]:
    """``body`` with the prefill worker's ``bootstrap_host``, ``bootstrap_port`` (null when it has
    none) and a fresh ``bootstrap_room``; for a batch of ``batch_size`` prompts, lists of that many
    (one room each). The same body goes to both sides. Raises 500 (:func:`require_bootstrap_host`)."""
    require_bootstrap_host(prefill)
    injected = dict(body)
    port = prefill.traits.bootstrap_port
    if batch_size is None:
        injected["bootstrap_host"] = prefill.host
        injected["bootstrap_port"] = port
        injected["bootstrap_room"] = http_room()
    else:
        injected["bootstrap_host"] = [prefill.host] * batch_size
        injected["bootstrap_port"] = [port] * batch_size
        injected["bootstrap_room"] = [http_room() for _ in range(batch_size)]
    return injected


def batch_size(path: str, body: Mapping[str, Any]) -> int | None:
    """How many prompts a request carries when it is a batch (each gets its own room), else None:
    a list of prompts for /v1/completions (strings or token lists), a list of texts or of token
    lists for /generate, ``n`` above 1 for chat completions (as the reference gateway counts)."""
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            return len(prompt)
        return None
    if path == "/generate":
        text = body.get("text")
        if isinstance(text, list):
            return len(text) or None
        ids = body.get("input_ids")
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return len(ids)
        return None
    if path == "/v1/chat/completions":
        n = body.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n > 1:
            return n
    return None


_NONE: Mapping[str, tuple[PdMember, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PdPool:
    """The ready prefill and decode workers, per model (and those that serve any model), built
    once per registry change."""

    prefill_by_model: Mapping[str, tuple[PdMember, ...]] = field(default_factory=lambda: _NONE)
    decode_by_model: Mapping[str, tuple[PdMember, ...]] = field(default_factory=lambda: _NONE)
    prefill_any: tuple[PdMember, ...] = ()
    decode_any: tuple[PdMember, ...] = ()
    # The models of ready encode workers the gateway serves (gRPC EPD), and whether one serves any model.
    encode_models: frozenset[str] = frozenset()
    encode_any: bool = False
    # Those encode workers themselves (their bootstrap port in their traits), per model and for any model.
    encode_by_model: Mapping[str, tuple[PdMember, ...]] = field(default_factory=lambda: _NONE)
    encode_any_model: tuple[PdMember, ...] = ()

    def encodes(self, model: str | None) -> bool:
        """Whether a ready engine encode worker serves ``model`` (None: any): an EPD deployment."""
        if model is None:
            return self.encode_any or bool(self.encode_models)
        return self.encode_any or model in self.encode_models

    def encoders(self, model: str | None) -> Sequence[PdMember]:
        """The ready engine encode workers for a canonical ``model`` (None: every one)."""
        if model is None:
            return tuple({id(m): m for ms in self.encode_by_model.values() for m in ms}.values()) + self.encode_any_model
        return self.encode_by_model.get(model) or self.encode_any_model

    def __bool__(self) -> bool:
        return bool(self.prefill_by_model or self.decode_by_model or self.prefill_any or self.decode_any)

    def has_pair(self) -> bool:
        """Whether some model (or any model) has a ready prefill and a ready decode worker with the
        same pairing key: PD requests can be served (readiness counts this like a regular worker)."""
        for model in {*self.prefill_by_model, *self.decode_by_model}:
            prefills, decodes = self.members(model)
            if {m.pairing for m in prefills} & {m.pairing for m in decodes}:
                return True
        return bool({m.pairing for m in self.prefill_any} & {m.pairing for m in self.decode_any})

    def members(self, model: str | None) -> tuple[Sequence[PdMember], Sequence[PdMember]]:
        """The prefill and decode candidates for a canonical ``model`` (None: every one)."""
        if model is None:
            return (
                tuple({id(m): m for ms in self.prefill_by_model.values() for m in ms}.values()) + self.prefill_any,
                tuple({id(m): m for ms in self.decode_by_model.values() for m in ms}.values()) + self.decode_any,
            )
        return (
            self.prefill_by_model.get(model) or self.prefill_any,
            self.decode_by_model.get(model) or self.decode_any,
        )


def build_pd_pool(
    handles: Iterable[WorkerHandle],
    traits_of: Callable[[WorkerRecord], PdTraits],
    context_of: Callable[[WorkerRecord], int | None] = lambda record: None,
) -> PdPool:
    """The pool of the ready prefill and decode workers among ``handles`` (registration order kept),
    and of the ready engine encode workers (gRPC EPD)."""
    by_model: dict[WorkerType, dict[str, list[PdMember]]] = {WorkerType.PREFILL: {}, WorkerType.DECODE: {}}
    any_model: dict[WorkerType, list[PdMember]] = {WorkerType.PREFILL: [], WorkerType.DECODE: []}
    encoders: dict[str, list[PdMember]] = {}
    encoders_any: list[PdMember] = []
    for handle in handles:
        record = handle.record
        kind = record.worker_type
        if kind == WorkerType.ENCODE and record.status == WorkerStatus.READY and record.kind is WorkerKind.ENGINE:
            encoder = PdMember.of(handle, traits_of(record), context_of(record))
            if not record.served_models:
                encoders_any.append(encoder)
            for model in record.served_models:
                encoders.setdefault(model, []).append(encoder)
            continue
        if kind not in by_model or record.status != WorkerStatus.READY:
            continue
        member = PdMember.of(handle, traits_of(record), context_of(record))
        served = record.served_models
        if not served:
            any_model[kind].append(member)
        for model in served:
            by_model[kind].setdefault(model, []).append(member)
    return PdPool(
        MappingProxyType({m: tuple(ms) for m, ms in by_model[WorkerType.PREFILL].items()}),
        MappingProxyType({m: tuple(ms) for m, ms in by_model[WorkerType.DECODE].items()}),
        tuple(any_model[WorkerType.PREFILL]),
        tuple(any_model[WorkerType.DECODE]),
        frozenset(encoders),
        bool(encoders_any),
        MappingProxyType({m: tuple(ms) for m, ms in encoders.items()}),
        tuple(encoders_any),
    )


# The prefill worker paired with each decode worker the current request tried (the request's task
# sets it as it picks a pair; the engine path reads it where it takes the decode worker's client).
_PARTNERS: ContextVar[dict[str, PdMember] | None] = ContextVar("pd_partners", default=None)


def choose_partner(pair: PdPair) -> None:
    """Remember, for the rest of the current request, that ``pair.decode`` runs with ``pair.prefill``."""
    partners = _PARTNERS.get()
    if partners is None:
        partners = {}
        _PARTNERS.set(partners)
    partners[pair.decode.handle.id] = pair.prefill


def pd_partner(worker_id: str) -> PdMember | None:
    """The prefill worker the current request paired with decode worker ``worker_id``, if any."""
    partners = _PARTNERS.get()
    return None if partners is None else partners.get(worker_id)
