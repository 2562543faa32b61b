"""The in-memory worker registry snapshot the request path reads (no database on the hot path).

The control plane publishes a new immutable :class:`RegistrySnapshot` whenever workers change; the
data plane reads ``REGISTRY.snapshot`` once per request. Live counters (requests in flight) sit in a
:class:`WorkerLoad` that survives snapshot rebuilds, keyed by worker id.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Iterable, Mapping

from inference.routing.pd import PdPool, build_pd_pool
from inference.routing.workers import PdTraits, WorkerHandle, WorkerLoad, WorkerRecord, WorkerStatus, WorkerType

__all__ = ["RegistrySnapshot", "WorkerRegistry", "REGISTRY"]


_EMPTY: Mapping[str, tuple[WorkerHandle, ...]] = MappingProxyType({})
_NOT_REGULAR = frozenset({WorkerType.PREFILL, WorkerType.DECODE, WorkerType.ENCODE})
_NO_TRAITS = PdTraits()


def _traits(record: WorkerRecord) -> PdTraits:
    return record.pd or _NO_TRAITS


@dataclass(frozen=True, slots=True)
class RegistrySnapshot:
    workers: tuple[WorkerHandle, ...] = ()
    # Ready workers per canonical model id, in registration order.
    routable_by_model: Mapping[str, tuple[WorkerHandle, ...]] = field(default_factory=lambda: _EMPTY)
    # Ready workers that report no model: they serve any model.
    routable_any_model: tuple[WorkerHandle, ...] = ()
    # Every model id some worker reports, ready or not (to tell 503 from 404).
    known_models: frozenset[str] = frozenset()
    # Workers still discovering what they serve (model unknown yet).
    undiscovered: int = 0
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Every ready worker, in registration order (requests that name no model choose among them).
    routable: tuple[WorkerHandle, ...] = ()
    # The models ready self-hosted workers serve (GET /v1/models), without external providers' lists.
    hosted_models: tuple[str, ...] = ()
    # The ready prefill and decode workers (prefill/decode disaggregation), which are never routable
    # as regular workers above (nor are encode workers).
    pd: PdPool = field(default_factory=PdPool)

    def canonical_model(self, name: str) -> str:
        return self.aliases.get(name, name)

    @property
    def routable_models(self) -> tuple[str, ...]:
        """Each self-hosted model a ready worker serves, once (external providers' models are theirs)."""
        return self.hosted_models


class WorkerRegistry:
    """Holds the current snapshot; a change swaps it atomically (a single reference assignment).

    ``publish`` replaces the whole fleet (a full reload); ``apply`` changes some workers by id (a
    delta: a registration, a status change, a removal). Both build the snapshot from the same
    ordered records, in registration order (``WorkerRecord.order``), so a run of deltas gives the
    snapshot a full reload of the same rows gives. A worker whose record did not change keeps its
    handle, and every worker keeps its live load.
    """

    def __init__(self) -> None:
        self.snapshot = RegistrySnapshot()
        self._records: dict[str, WorkerRecord] = {}
        self._handles: dict[str, WorkerHandle] = {}
        # Wall-clock time (Unix seconds) of the load monitor's last completed poll; None before it.
        self.loads_polled_at: float | None = None

    def load_of(self, worker_id: str) -> WorkerLoad | None:
        """The live state of a worker in the current snapshot (None once it left the registry)."""
        handle = self._handles.get(worker_id)
        return None if handle is None else handle.load

    def publish_status(self, worker_id: str, status: WorkerStatus) -> RegistrySnapshot | None:
        """Publish the snapshot with one worker's status changed (a health transition made in this
        process, routed at once without reading the store); None when nothing changed."""
        record = self._records.get(worker_id)
        if record is None or record.status == status:
            return None
        return self.apply({worker_id: replace(record, status=status)})

    def publish(self, records: Iterable[WorkerRecord], aliases: Mapping[str, str]) -> RegistrySnapshot:
        """The whole fleet, in registration order (a full reload)."""
        self._records = {record.id: record for record in records}
        return self._build(aliases)

    def apply(self, changes: Mapping[str, WorkerRecord | None], aliases: Mapping[str, str] | None = None) -> RegistrySnapshot:
        """Change these workers (None: it left) and publish; ``aliases`` replaces the aliases when
        given. Cost: O(changes) plus one pass over the fleet to rebuild the snapshot's indexes."""
        records = self._records
        arrived = False
        for worker_id, record in changes.items():
            if record is None:
                records.pop(worker_id, None)
            else:
                arrived = arrived or worker_id not in records
                records[worker_id] = record
        if arrived:  # a new worker takes its place in registration order, as a full reload puts it
            self._records = dict(sorted(records.items(), key=lambda item: item[1].order))
        return self._build(self.snapshot.aliases if aliases is None else aliases)

    def _build(self, aliases: Mapping[str, str]) -> RegistrySnapshot:
        previous = self._handles
        handles: dict[str, WorkerHandle] = {}
        by_model: dict[str, list[WorkerHandle]] = {}
        any_model: list[WorkerHandle] = []
        known: set[str] = set()
        hosted: dict[str, None] = {}  # insertion-ordered set
        undiscovered = 0
        for worker_id, record in self._records.items():
            handle = previous.get(worker_id)
            if handle is None:
                load = WorkerLoad()
                handle = WorkerHandle(record, load)
                load.breaker.config = record.resilience
                load.breaker.label = record.url
            elif handle.record is not record:
                load = handle.load
                load.breaker.config = record.resilience
                load.breaker.label = record.url
                handle = WorkerHandle(record, load)
            handles[worker_id] = handle
            served = record.served_models
            if served:
                known.update(served)
            elif record.status != WorkerStatus.READY:
                undiscovered += 1
            if record.status != WorkerStatus.READY:
                continue
            if record.worker_type in _NOT_REGULAR:
                if served and not record.models:
                    hosted[served[0]] = None
                continue
            if served:
                for model in served:
                    by_model.setdefault(model, []).append(handle)
                if not record.models:
                    hosted[served[0]] = None
            else:
                any_model.append(handle)
        self._handles = handles
        routable = tuple(
            handle for handle in handles.values()
            if handle.record.status == WorkerStatus.READY and handle.record.worker_type not in _NOT_REGULAR
        )
        self.snapshot = RegistrySnapshot(
            workers=tuple(handles.values()),
            routable_by_model=MappingProxyType({m: tuple(h) for m, h in by_model.items()}),
            routable_any_model=tuple(any_model),
            known_models=frozenset(known),
            undiscovered=undiscovered,
            aliases=aliases if isinstance(aliases, MappingProxyType) else MappingProxyType(dict(aliases)),
            routable=routable,
            hosted_models=tuple(hosted),
            pd=build_pd_pool(handles.values(), _traits, _context_length),
        )
        return self.snapshot


def _context_length(record: WorkerRecord) -> int | None:
    return record.engine.context_length if record.engine is not None else None


REGISTRY = WorkerRegistry()
