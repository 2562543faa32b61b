"""The in-memory worker registry snapshot the request path reads (no database on the hot path).

The control plane publishes a new immutable :class:`RegistrySnapshot` whenever workers change; the
data plane reads ``REGISTRY.snapshot`` once per request. Live counters (requests in flight) sit in a
:class:`WorkerLoad` that survives snapshot rebuilds, keyed by worker id.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
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
    # False while the process waits for its first load from the store (it started while the store did
    # not answer): no model is unknown yet, every request naming one is 503, not 404.
    loaded: bool = True

    def canonical_model(self, name: str) -> str:
        return self.aliases.get(name, name)

    @property
    def routable_models(self) -> tuple[str, ...]:
        """Each self-hosted model a ready worker serves, once (external providers' models are theirs)."""
        return self.hosted_models


class WorkerRegistry:
    """Holds the current snapshot; a change swaps it atomically (a single reference assignment).

    ``publish`` replaces the whole fleet (a full reload); ``apply`` changes some workers by id (a
    delta: a registration, a status change, a removal). The registry keeps every index of the
    snapshot (the routable workers, per model, the prefill/decode members, the hosted models, the
    model counts) as lists in registration order (``WorkerRecord.order``, then arrival), so a delta
    moves just its workers in them (a binary search each) and the snapshot is made from those lists
    by C-level copies: a registration costs the same at 1,000 workers as at one. A run of deltas
    gives the snapshot a full reload of the same rows gives. A worker whose record did not change
    keeps its handle, and every worker keeps its live load.
    """

    def __init__(self) -> None:
        self.snapshot = RegistrySnapshot()
        self._handles: dict[str, WorkerHandle] = {}
        self._ordered: list[WorkerHandle] = []  # every worker, in registration order
        self._rank: dict[str, int] = {}  # arrival number: ties between equal orders keep arrival order
        self._arrivals = 0
        self._routable: list[WorkerHandle] = []
        self._any_model: list[WorkerHandle] = []
        self._by_model: dict[str, list[WorkerHandle]] = {}
        self._hosting: dict[str, list[WorkerHandle]] = {}  # hosted model -> the ready workers that host it
        self._known: Counter[str] = Counter()
        self._undiscovered = 0
        self._pd_members: list[WorkerHandle] = []  # prefill, decode and encode workers, any status
        # Wall-clock time (Unix seconds) of the load monitor's last completed poll; None before it.
        self.loads_polled_at: float | None = None

    def awaiting_first_load(self) -> None:
        """The snapshot before anything could be read from the store: empty and marked not loaded
        (the next publish or change makes a loaded one)."""
        self.snapshot = RegistrySnapshot(loaded=False)

    def load_of(self, worker_id: str) -> WorkerLoad | None:
        """The live state of a worker in the current snapshot (None once it left the registry)."""
        handle = self._handles.get(worker_id)
        return None if handle is None else handle.load

    def record_of(self, worker_id: str) -> WorkerRecord | None:
        handle = self._handles.get(worker_id)
        return None if handle is None else handle.record

    def publish_status(self, worker_id: str, status: WorkerStatus) -> RegistrySnapshot | None:
        """Publish the snapshot with one worker's status changed (a health transition made in this
        process, routed at once without reading the store); None when nothing changed."""
        record = self.record_of(worker_id)
        if record is None or record.status == status:
            return None
        return self.apply({worker_id: replace(record, status=status)})

    def publish(self, records: Iterable[WorkerRecord], aliases: Mapping[str, str]) -> RegistrySnapshot:
        """The whole fleet, in registration order (a full reload)."""
        previous = self._handles
        self.__init_indexes()
        for record in records:
            self._add(_handle_for(record, previous.get(record.id)))
        return self._publish(aliases, pd=True)

    def apply(self, changes: Mapping[str, WorkerRecord | None], aliases: Mapping[str, str] | None = None) -> RegistrySnapshot:
        """Change these workers (None: it left) and publish; ``aliases`` replaces the aliases when
        given. Cost: O(changes x log fleet) plus copies of the snapshot's lists."""
        pd = False
        for worker_id, record in changes.items():
            old = self._handles.get(worker_id)
            if old is not None:
                if record is not None and old.record is record:
                    continue
                pd = pd or old.record.worker_type in _NOT_REGULAR
                self._remove(old)
            if record is None:
                self._handles.pop(worker_id, None)
                self._rank.pop(worker_id, None)
                continue
            handle = _handle_for(record, old)
            pd = pd or record.worker_type in _NOT_REGULAR
            if old is None:
                self._arrivals += 1
                self._rank[worker_id] = self._arrivals
            self._handles[worker_id] = handle
            self._add(handle)
        return self._publish(self.snapshot.aliases if aliases is None else aliases, pd=pd)

    def __init_indexes(self) -> None:
        self._handles = {}
        self._ordered = []
        self._rank = {}
        self._arrivals = 0
        self._routable = []
        self._any_model = []
        self._by_model = {}
        self._hosting = {}
        self._known = Counter()
        self._undiscovered = 0
        self._pd_members = []

    def _key(self, handle: WorkerHandle) -> tuple[tuple[float, str], int]:
        return handle.record.order, self._rank[handle.record.id]

    def _add(self, handle: WorkerHandle) -> None:
        record = handle.record
        if record.id not in self._rank:  # a full reload: arrival in the order given
            self._arrivals += 1
            self._rank[record.id] = self._arrivals
            self._handles[record.id] = handle
        for place in self._places(record):
            insort(place, handle, key=self._key)
        served = record.served_models
        self._known.update(served)
        if not served and record.status != WorkerStatus.READY:
            self._undiscovered += 1

    def _remove(self, handle: WorkerHandle) -> None:
        record = handle.record
        key = self._key(handle)
        for place in self._places(record):
            index = bisect_left(place, key, key=self._key)
            if index < len(place) and place[index].record.id == record.id:
                del place[index]
        for model in self._by_model.keys() & record.served_models:
            if not self._by_model[model]:
                del self._by_model[model]
        for model in [model for model in record.served_models[:1] if model in self._hosting and not self._hosting[model]]:
            del self._hosting[model]
        self._known.subtract(record.served_models)
        for model in record.served_models:
            if self._known[model] <= 0:
                del self._known[model]
        if not record.served_models and record.status != WorkerStatus.READY:
            self._undiscovered -= 1

    def _places(self, record: WorkerRecord) -> list[list[WorkerHandle]]:
        """The ordered lists this worker belongs in (as the snapshot's indexes define them)."""
        places: list[list[WorkerHandle]] = [self._ordered]
        if record.worker_type in _NOT_REGULAR:
            places.append(self._pd_members)
        if record.status != WorkerStatus.READY:
            return places
        served = record.served_models
        if served and not record.models:
            places.append(self._hosting.setdefault(served[0], []))
        if record.worker_type in _NOT_REGULAR:
            return places
        places.append(self._routable)
        if served:
            places.extend(self._by_model.setdefault(model, []) for model in served)
        else:
            places.append(self._any_model)
        return places

    def _publish(self, aliases: Mapping[str, str], *, pd: bool) -> RegistrySnapshot:
        hosting = self._hosting
        self.snapshot = RegistrySnapshot(
            workers=tuple(self._ordered),
            routable_by_model=MappingProxyType({model: tuple(handles) for model, handles in self._by_model.items()}),
            routable_any_model=tuple(self._any_model),
            known_models=frozenset(self._known),
            undiscovered=self._undiscovered,
            aliases=aliases if isinstance(aliases, MappingProxyType) else MappingProxyType(dict(aliases)),
            routable=tuple(self._routable),
            hosted_models=tuple(sorted(hosting, key=lambda model: self._key(hosting[model][0]))),
            pd=build_pd_pool(self._pd_members, _traits, _context_length) if pd else self.snapshot.pd,
        )
        return self.snapshot


def _handle_for(record: WorkerRecord, previous: WorkerHandle | None) -> WorkerHandle:
    """The worker's handle for this record: the previous one when the record is the same, else a new
    one carrying the previous live load (breakers configured from the record)."""
    if previous is not None and previous.record is record:
        return previous
    load = WorkerLoad() if previous is None else previous.load
    load.breaker.config = record.resilience
    load.breaker.label = record.url
    return WorkerHandle(record, load)


def _context_length(record: WorkerRecord) -> int | None:
    return record.engine.context_length if record.engine is not None else None


REGISTRY = WorkerRegistry()
