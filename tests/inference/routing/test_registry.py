"""The registry snapshot: a status change seen in this process is published without a reload."""

from __future__ import annotations

from inference.routing.registry import WorkerRegistry
from inference.routing.workers import WorkerRecord, WorkerStatus


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
