"""The in-memory worker registry snapshot the request path reads (no database on the hot path).

The control plane publishes a new immutable :class:`RegistrySnapshot` whenever workers change; the
data plane reads ``REGISTRY.snapshot`` once per request. Live counters (requests in flight) sit in a
:class:`WorkerLoad` that survives snapshot rebuilds, keyed by worker id.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Iterable, Mapping

from inference.routing.workers import WorkerHandle, WorkerLoad, WorkerRecord, WorkerStatus

__all__ = ["RegistrySnapshot", "WorkerRegistry", "REGISTRY"]


_EMPTY: Mapping[str, tuple[WorkerHandle, ...]] = MappingProxyType({})


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

    def canonical_model(self, name: str) -> str:
        return self.aliases.get(name, name)

    @property
    def routable(self) -> tuple[WorkerHandle, ...]:
        seen: dict[str, WorkerHandle] = {}
        for handles in self.routable_by_model.values():
            for handle in handles:
                seen.setdefault(handle.id, handle)
        for handle in self.routable_any_model:
            seen.setdefault(handle.id, handle)
        return tuple(seen.values())

    @property
    def routable_models(self) -> tuple[str, ...]:
        return tuple(self.routable_by_model)


class WorkerRegistry:
    """Holds the current snapshot; ``publish`` swaps it atomically (a single reference assignment)."""

    def __init__(self) -> None:
        self.snapshot = RegistrySnapshot()
        self._loads: dict[str, WorkerLoad] = {}
        # Wall-clock time (Unix seconds) of the load monitor's last completed poll; None before it.
        self.loads_polled_at: float | None = None

    def load_of(self, worker_id: str) -> WorkerLoad | None:
        """The live state of a worker in the current snapshot (None once it left the registry)."""
        return self._loads.get(worker_id)

    def publish_status(self, worker_id: str, status: WorkerStatus) -> RegistrySnapshot | None:
        """Publish the snapshot with one worker's status changed (a health transition made in this
        process, routed at once without reading the store); None when nothing changed."""
        records = []
        changed = False
        for handle in self.snapshot.workers:
            record = handle.record
            if record.id == worker_id and record.status != status:
                record = replace(record, status=status)
                changed = True
            records.append(record)
        return self.publish(records, self.snapshot.aliases) if changed else None

    def publish(self, records: Iterable[WorkerRecord], aliases: Mapping[str, str]) -> RegistrySnapshot:
        handles: list[WorkerHandle] = []
        loads: dict[str, WorkerLoad] = {}
        by_model: dict[str, list[WorkerHandle]] = {}
        any_model: list[WorkerHandle] = []
        known: set[str] = set()
        undiscovered = 0
        for record in records:
            load = self._loads.get(record.id) or WorkerLoad()
            load.breaker.config = record.resilience
            load.breaker.label = record.url
            loads[record.id] = load
            handle = WorkerHandle(record, load)
            handles.append(handle)
            if record.model_id:
                known.add(record.model_id)
            elif record.status != WorkerStatus.READY:
                undiscovered += 1
            if record.status != WorkerStatus.READY:
                continue
            if record.model_id:
                by_model.setdefault(record.model_id, []).append(handle)
            else:
                any_model.append(handle)
        self._loads = loads
        self.snapshot = RegistrySnapshot(
            workers=tuple(handles),
            routable_by_model=MappingProxyType({m: tuple(h) for m, h in by_model.items()}),
            routable_any_model=tuple(any_model),
            known_models=frozenset(known),
            undiscovered=undiscovered,
            aliases=MappingProxyType(dict(aliases)),
        )
        return self.snapshot


REGISTRY = WorkerRegistry()
