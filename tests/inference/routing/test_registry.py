"""The registry snapshot: a status change seen in this process is published without a reload, and
changes applied one worker at a time give what a full reload of the same records gives."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from inference.routing.registry import RegistrySnapshot, WorkerRegistry
from inference.routing.workers import WorkerRecord, WorkerStatus, WorkerType


def test_a_status_change_is_published_without_a_reload() -> None:
    registry = WorkerRegistry()
    registry.publish([WorkerRecord(id="w", url="http://w:1", model_id="m", runtime_type="sglang",
                                   status=WorkerStatus.PENDING)], {"alias": "m"})
    load = registry.load_of("w")
    assert registry.snapshot.routable == ()
    assert registry.publish_status("w", WorkerStatus.READY) is not None
    assert [h.id for h in registry.snapshot.routable] == ["w"] and registry.load_of("w") is load
    assert registry.snapshot.aliases == {"alias": "m"}
    assert registry.publish_status("w", WorkerStatus.READY) is None  # nothing changed
    assert registry.publish_status("gone", WorkerStatus.READY) is None


def _everything(snapshot: RegistrySnapshot) -> tuple[Any, ...]:
    """Every index of a snapshot, in its order (registration order counts for routing)."""
    pd = snapshot.pd
    return (
        [h.record for h in snapshot.workers],
        sorted((model, [h.id for h in handles]) for model, handles in snapshot.routable_by_model.items()),
        [h.id for h in snapshot.routable_any_model],
        [h.id for h in snapshot.routable],
        snapshot.known_models,
        snapshot.undiscovered,
        snapshot.hosted_models,
        dict(snapshot.aliases),
        sorted((m, [x.handle.id for x in ms]) for m, ms in pd.prefill_by_model.items()),
        sorted((m, [x.handle.id for x in ms]) for m, ms in pd.decode_by_model.items()),
        [x.handle.id for x in pd.prefill_any], [x.handle.id for x in pd.decode_any],
        sorted((m, [x.handle.id for x in ms]) for m, ms in pd.encode_by_model.items()),
    )


def test_deltas_give_what_a_full_reload_of_the_same_records_gives() -> None:
    """Random registrations (some finishing out of registration order), status moves, model and type
    changes and removals, applied one worker at a time: after each, every index of the snapshot is
    what publishing the same records at once gives, and a worker keeps its live load throughout."""
    rng = random.Random(78)
    registry = WorkerRegistry()
    records: dict[str, WorkerRecord] = {}
    loads: dict[str, Any] = {}
    statuses = [WorkerStatus.READY, WorkerStatus.PENDING, WorkerStatus.NOT_READY, WorkerStatus.DRAINING]
    types = [WorkerType.REGULAR, WorkerType.REGULAR, WorkerType.PREFILL, WorkerType.DECODE]

    def made(worker_id: str, order: tuple[float, str]) -> WorkerRecord:
        model = rng.choice([None, "m1", "m2", "m3"])
        return WorkerRecord(
            id=worker_id, url=f"http://{worker_id}:1", model_id=model, runtime_type="sglang", status=rng.choice(statuses),
            worker_type=rng.choice(types), order=order,
            models=("p1", "p2") if model is None and rng.random() < 0.2 else (),
        )

    for step in range(400):
        action = rng.random()
        if action < 0.4 or not records:
            worker_id = f"w{step}"
            record = made(worker_id, (float(rng.randrange(1000)), worker_id))  # arrives in any order
        elif action < 0.85:
            worker_id = rng.choice(list(records))
            record = replace(made(worker_id, records[worker_id].order)) if rng.random() < 0.3 else replace(
                records[worker_id], status=rng.choice(statuses))
        else:
            worker_id = rng.choice(list(records))
            records.pop(worker_id)
            registry.apply({worker_id: None})
            loads.pop(worker_id)
            assert registry.load_of(worker_id) is None
            continue
        records[worker_id] = record
        registry.apply({worker_id: record}, {"alias": "m1"} if step % 50 == 0 else None)
        loads.setdefault(worker_id, registry.load_of(worker_id))
        full = WorkerRegistry()
        full.publish(sorted(records.values(), key=lambda r: r.order), registry.snapshot.aliases)
        assert _everything(registry.snapshot) == _everything(full.snapshot), step
        assert all(registry.load_of(worker_id) is load for worker_id, load in loads.items())
