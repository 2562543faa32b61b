"""One read of the store per registry refresh: a worker registered while the refresh reads (a job
finishing on another thread or process) is either in the snapshot or in the next one, never a
KeyError that fails the start-up (the race seen at 1,000 workers)."""

from __future__ import annotations

from typing import Any

import pytest

from administration.models import Worker, WorkerQuerySet, WorkerStatus
from administration.registry_sync import load_fleet_state
from common.config import GatewayConfig


def _worker(url: str) -> Worker:
    return Worker.objects.create(url=url, registered=True, status=WorkerStatus.READY, model_id="m",
                                 runtime_type="sglang")


@pytest.mark.django_db
def test_a_worker_registered_during_the_read_does_not_break_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _worker("http://before:1")
    original = WorkerQuerySet.listed
    registered: list[str] = []

    def listed_then_register(self: WorkerQuerySet) -> Any:
        rows = list(original(self))
        if not registered:  # a job commits a new worker right after this read
            registered.append(str(_worker("http://during:1").pk))
        return rows

    monkeypatch.setattr(WorkerQuerySet, "listed", listed_then_register)
    state = load_fleet_state(GatewayConfig())
    assert [record.url for record in state.records] == ["http://before:1"]
    assert [target.url for target in state.health] == ["http://before:1"]
    monkeypatch.setattr(WorkerQuerySet, "listed", original)
    assert sorted(record.url for record in load_fleet_state(GatewayConfig()).records) == [
        "http://before:1", "http://during:1",
    ]
