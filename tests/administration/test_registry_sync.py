"""The registry kept in step with the store: one read of the store per full reload (a worker
registered while it reads is in this snapshot or the next, never a KeyError that fails the start-up:
the race seen at 1,000 workers), the change log, and deltas that give what a full reload gives."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import AsyncClient
from django.utils import timezone

from administration.api import workers as api_workers
from administration.db import arun_db
from administration.health import transition
from administration.lifecycle import LIFECYCLE
from administration.models import RegistryChange, Worker, WorkerQuerySet, WorkerStatus
from administration.notices import (
    CHANGE_RETENTION, changes_since, latest_change, prune_changes, publish_registry_changed, record_change,
)
from administration.registry_sync import RegistrySync, fleet_aliases, load_fleet_state
from common.config import GatewayConfig, install_config
from inference.routing.registry import REGISTRY, RegistrySnapshot, WorkerRegistry


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


# --- The change log and the registry's deltas -------------------------------------------------

def _view(snapshot: RegistrySnapshot) -> tuple[Any, ...]:
    """Everything a snapshot tells the request path, comparable."""
    return (
        [handle.record for handle in snapshot.workers],
        {model: [handle.id for handle in handles] for model, handles in snapshot.routable_by_model.items()},
        [handle.id for handle in snapshot.routable_any_model],
        snapshot.known_models,
        snapshot.undiscovered,
        dict(snapshot.aliases),
    )


def _full_reload_view(config: GatewayConfig) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """What a full reload of the store gives: the snapshot, the health and the load targets."""
    state = load_fleet_state(config)
    registry = WorkerRegistry()
    snapshot = registry.publish(state.records, fleet_aliases(config, state.workers.values()))
    return (_view(snapshot), {t.worker_id: t for t in state.health}, {t.worker_id: t for t in state.loads})


@pytest.mark.django_db(transaction=True)
def test_changes_are_logged_by_worker_and_read_in_order() -> None:
    before = latest_change()
    worker = _worker("http://logged:1")
    record_change(worker.pk)
    publish_registry_changed(str(worker.pk))
    publish_registry_changed()  # not one worker's change (tenant limits)
    changes = changes_since(before, 10)
    assert [worker_id for _, worker_id in changes] == [str(worker.pk), str(worker.pk), None]
    assert [seq for seq, _ in changes] == sorted(seq for seq, _ in changes)
    assert latest_change() == changes[-1][0]
    assert changes_since(before, 2) == changes[:2]


@pytest.mark.django_db(transaction=True)
def test_changes_older_than_the_retention_are_pruned() -> None:
    old = record_change()
    RegistryChange.objects.filter(seq=old).update(at=timezone.now() - CHANGE_RETENTION - timedelta(seconds=1))
    kept = record_change()
    assert prune_changes() == 1
    assert [seq for seq, _ in changes_since(0, 10)] == [kept]


@pytest.mark.django_db(transaction=True)
async def test_deltas_give_what_a_full_reload_gives() -> None:
    """Registrations (one finishing out of order), status moves, a model change with aliases and a
    removal, each applied by re-reading only the workers it named: after every step the snapshot,
    the health-check targets and the load-poll targets are what a full reload of the store gives,
    and the whole fleet was read once (at the start)."""
    config = GatewayConfig(
        model_aliases=(("fast", "m1"),), health_check_interval_secs=3600.0, health_failure_threshold=1000,
    )
    sync = RegistrySync(config)  # leads: it keeps health and load targets too

    async def write(**fields: Any) -> Worker:
        worker = await Worker.objects.acreate(**{"registered": True, "runtime_type": "sglang", **fields})
        return worker

    async def step() -> None:
        await sync.acatch_up()
        expected_view, expected_health, expected_loads = await arun_db(_full_reload_view, config)
        assert _view(REGISTRY.snapshot) == expected_view
        assert sync.health._targets == expected_health
        assert sync.loads._targets == expected_loads

    try:
        await sync.arefresh()
        a = await write(url="http://127.0.0.1:9/a", model_id="m1", status=WorkerStatus.READY)
        late = await write(url="http://127.0.0.1:9/late", model_id="m2", registered=False)  # registration runs
        b = await write(url="http://127.0.0.1:9/b", model_id="m2", status=WorkerStatus.READY)
        c = await write(url="http://127.0.0.1:9/c", status=WorkerStatus.PENDING)  # model not known yet
        for worker in (a, late, b, c):
            await arun_db(record_change, worker.pk)
        await step()
        assert [h.url for h in REGISTRY.snapshot.workers] == ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b",
                                                              "http://127.0.0.1:9/c"]

        # The registration that started second finishes last: it takes its place in registration order.
        await Worker.objects.filter(pk=late.pk).aupdate(registered=True, status=WorkerStatus.PENDING)
        await arun_db(record_change, late.pk)
        await step()
        assert [h.url for h in REGISTRY.snapshot.workers][1] == "http://127.0.0.1:9/late"

        # Health moves, one through the checker's own path (routed at once, then confirmed by the log).
        assert await arun_db(transition, str(late.pk), WorkerStatus.PENDING, WorkerStatus.READY)
        REGISTRY.publish_status(str(late.pk), WorkerStatus.READY)
        assert await arun_db(transition, str(a.pk), WorkerStatus.READY, WorkerStatus.NOT_READY)
        await step()
        assert [h.url for h in REGISTRY.snapshot.routable_by_model["m2"]] == [
            "http://127.0.0.1:9/late", "http://127.0.0.1:9/b",
        ]

        # A model change brings its card's aliases; the flag's alias stays first.
        cards = [{"id": "m3", "aliases": ["fast", "third"]}]
        await Worker.objects.filter(pk=c.pk).aupdate(model_id="m3", model_cards=cards, status=WorkerStatus.READY)
        await arun_db(record_change, c.pk)
        await step()
        assert REGISTRY.snapshot.canonical_model("third") == "m3"
        assert REGISTRY.snapshot.canonical_model("fast") == "m1"

        # A removal (and a change to a worker that is gone by the time it is read).
        await Worker.objects.filter(pk=b.pk).adelete()
        await arun_db(record_change, b.pk)
        await step()
        assert "http://127.0.0.1:9/b" not in [h.url for h in REGISTRY.snapshot.workers]
        assert sync.full_reloads == 1

        # A change that is not one worker's reloads the whole fleet.
        await arun_db(record_change)
        await step()
        assert sync.full_reloads == 2
    finally:
        await sync.astop()
        REGISTRY.publish([], {})


@pytest.mark.django_db(transaction=True)
async def test_a_change_committed_after_a_later_one_is_still_applied() -> None:
    """Change numbers are taken when written, not when committed: a change whose number is below one
    already applied (a slower writer) is read by the next catch-up, not skipped."""
    config = GatewayConfig(disable_health_check=True)
    sync = RegistrySync(config)
    try:
        await sync.arefresh()
        first = await Worker.objects.acreate(url="http://127.0.0.1:9/first", registered=True, model_id="m",
                                             runtime_type="sglang", status=WorkerStatus.READY)
        second = await Worker.objects.acreate(url="http://127.0.0.1:9/second", registered=True, model_id="m",
                                              runtime_type="sglang", status=WorkerStatus.READY)
        slow = await arun_db(record_change, first.pk)
        fast = await arun_db(record_change, second.pk)
        # As the log looked while the first writer had not committed yet:
        await RegistryChange.objects.filter(seq=slow).adelete()
        await sync.acatch_up()
        assert [h.url for h in REGISTRY.snapshot.workers] == ["http://127.0.0.1:9/second"]
        await RegistryChange.objects.acreate(seq=slow, worker_id=first.pk)  # now it commits
        await sync.acatch_up()
        assert [h.url for h in REGISTRY.snapshot.workers] == ["http://127.0.0.1:9/first", "http://127.0.0.1:9/second"]
        assert sync.full_reloads == 1 and fast > slow
    finally:
        await sync.astop()
        REGISTRY.publish([], {})


@pytest.mark.django_db(transaction=True)
async def test_get_workers_lists_from_memory_while_it_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /workers answers from the fleet loop's copy when it has applied every recorded change
    (the same body the store gives), and from the store as soon as a change is not applied yet."""
    config = GatewayConfig(disable_health_check=True)
    install_config(config, export=False)
    sync = RegistrySync(config)
    monkeypatch.setattr(LIFECYCLE, "fleet", sync)
    api = AsyncClient()
    try:
        await Worker.objects.acreate(url="http://127.0.0.1:9/a", registered=True, model_id="m1", runtime_type="sglang",
                                     status=WorkerStatus.READY, model_cards=[{"id": "m1", "aliases": ["one"]}])
        await Worker.objects.acreate(url="http://127.0.0.1:9/b", registered=True, runtime_type="vllm",
                                     status=WorkerStatus.PENDING, worker_type="prefill", job_type="UpdateWorker",
                                     job_state="processing", job_updated_at=timezone.now())
        await Worker.objects.acreate(url="http://127.0.0.1:9/hidden", registered=False)  # registration runs
        from_store = (await api.get("/workers")).json()
        await sync.arefresh()

        def no_store(*args: Any) -> Any:
            raise AssertionError("read the store")

        monkeypatch.setattr(api_workers, "list_workers", no_store)
        from_memory = (await api.get("/workers")).json()
        assert from_memory == from_store and from_memory["total"] == 2
        assert from_memory["stats"] == {"prefill_count": 1, "decode_count": 0, "regular_count": 1}
        assert from_memory["workers"][1]["job_status"]["status"] == "processing"
        assert [w["url"] for w in (await api.get("/workers?model=one")).json()["workers"]] == [
            "http://127.0.0.1:9/a", "http://127.0.0.1:9/b",  # b lists no model: it may serve any
        ]

        # A change recorded but not applied yet: the store answers.
        await Worker.objects.acreate(url="http://127.0.0.1:9/c", registered=True, runtime_type="sglang",
                                     status=WorkerStatus.READY)
        await arun_db(record_change)
        monkeypatch.undo()
        monkeypatch.setattr(LIFECYCLE, "fleet", sync)
        assert (await api.get("/workers")).json()["total"] == 3
    finally:
        await sync.astop()
        REGISTRY.publish([], {})
        install_config(GatewayConfig(), export=False)
