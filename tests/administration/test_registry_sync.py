"""The registry kept in step with the store: one read of the store per full reload (a worker
registered while it reads is in this snapshot or the next, never a KeyError that fails the start-up:
the race seen at 1,000 workers), the change log, and deltas that give what a full reload gives."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.test import AsyncClient
from django.db import OperationalError
from django.utils import timezone

from administration import notices
from administration.api import workers as api_workers
from common.db import arun_db
from administration.health import transition
from administration.lifecycle import LIFECYCLE
from administration.models import RegistryChange, Worker, WorkerQuerySet, WorkerStatus
from administration.notices import (
    CHANGE_RETENTION, Notice, add_local_listener, changes_since, latest_change, notice_message, parse_notice,
    prune_changes, publish_registry_changed, record_change, remove_local_listener,
)
from administration import registry_sync
from administration.registry_sync import RegistrySync, fleet_aliases, load_fleet_state
from common.config import GatewayConfig, install_config
from common.outages import STORE
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
def test_the_newest_change_is_zero_on_an_empty_log_and_follows_deletions() -> None:
    """latest_change (one written statement, D94): 0 before the first change, the newest number
    after, the newest remaining one once older changes are pruned."""
    RegistryChange.objects.all().delete()
    assert latest_change() == 0
    first, second = record_change(), record_change()
    assert latest_change() == second > first
    RegistryChange.objects.filter(seq=second).delete()
    assert latest_change() == first


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


# --- Notices that carry the change (D78) -------------------------------------------------------

async def _settled(sync: RegistrySync) -> None:
    """Wait until the sync has applied what it was told (its notices read, its catch-up done)."""
    for _ in range(500):
        await asyncio.sleep(0.01)
        if (sync._syncing is None or sync._syncing.done()) and not sync._noticed:
            return
    raise AssertionError("the registry sync did not settle")


async def _ready(url: str) -> Worker:
    return await Worker.objects.acreate(url=url, registered=True, status=WorkerStatus.READY, model_id="m",
                                        runtime_type="sglang")


async def _changed(worker: Worker) -> Notice:
    """A committed change to ``worker`` and the notice that tells of it."""
    return Notice(await arun_db(record_change, worker.pk), str(worker.pk))


@pytest.mark.django_db(transaction=True)
async def test_notices_are_applied_by_delta_and_a_lost_one_is_repaired() -> None:
    """Notices that follow on from the last change applied are applied without reading the log (each
    worker re-read by itself); a lost notice leaves a gap, which sends the process to the log; a
    garbled notice reloads the whole fleet; and a change the log no longer has is repaired by the
    full reload (the safety net)."""
    config = GatewayConfig(disable_health_check=True)
    registry = WorkerRegistry()
    sync = RegistrySync(config, registry=registry)

    def urls() -> list[str]:
        return [handle.url for handle in registry.snapshot.workers]

    try:
        await arun_db(record_change)  # the log's newest number is where the notices follow on from
        await sync.arefresh()
        reads = sync.log_reads
        a = await _ready("http://127.0.0.1:9/a")
        b = await _ready("http://127.0.0.1:9/b")
        for notice in (await _changed(a), await _changed(b)):
            sync.received(notice_message(notice))
        await _settled(sync)
        assert urls() == ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]
        assert sync.log_reads == reads and sync.deltas == 2 and sync.full_reloads == 1

        # A status change and a removal, by notice alone.
        await Worker.objects.filter(pk=a.pk).aupdate(status=WorkerStatus.NOT_READY)
        sync.received(notice_message(await _changed(a)))
        gone = Notice(None, str(b.pk))
        await b.adelete()
        sync.received(notice_message(gone._replace(seq=await arun_db(record_change, gone.worker_id))))
        await _settled(sync)
        assert urls() == ["http://127.0.0.1:9/a"] and registry.snapshot.routable == ()
        assert sync.log_reads == reads

        # A notice lost (c's): d's does not follow on, so the log is read and both are applied.
        c = await _ready("http://127.0.0.1:9/c")
        await _changed(c)
        d = await _ready("http://127.0.0.1:9/d")
        sync.received(notice_message(await _changed(d)))
        await _settled(sync)
        assert urls() == ["http://127.0.0.1:9/a", "http://127.0.0.1:9/c", "http://127.0.0.1:9/d"]
        assert sync.log_reads == reads + 1 and sync.full_reloads == 1

        # A garbled notice: what it said is unknown, so the fleet is reloaded.
        sync.received({"type": "registry.changed", "seq": "many", "worker": 3})
        await _settled(sync)
        assert sync.full_reloads == 2

        # A change whose notice was lost and whose log row is gone (pruned): the full reload repairs it.
        e = await _ready("http://127.0.0.1:9/e")
        lost = await _changed(e)
        assert lost.seq is not None
        await RegistryChange.objects.filter(seq=lost.seq).adelete()
        await sync.acatch_up()
        assert "http://127.0.0.1:9/e" not in urls()
        await sync.arefresh()
        assert urls()[-1] == "http://127.0.0.1:9/e"
    finally:
        await sync.astop()


@pytest.mark.django_db(transaction=True)
async def test_a_change_the_store_could_not_log_reloads_the_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registration whose change the store refused to log (locked under a burst of registrations,
    or down) tells its notice without a number: the log does not have the change, so the fleet is
    read again and the worker is routed (it used to wait for the five-minute safety net)."""
    config = GatewayConfig(disable_health_check=True)
    registry = WorkerRegistry()
    sync = RegistrySync(config, registry=registry)
    sync._loop = asyncio.get_running_loop()
    add_local_listener(sync.notify)
    try:
        await arun_db(record_change)
        await sync.arefresh()
        worker = await _ready("http://127.0.0.1:9/unlogged")

        def refused(worker_id: Any = None) -> int:
            raise OperationalError("database is locked")

        monkeypatch.setattr(notices, "record_change", refused)
        await arun_db(publish_registry_changed, worker.pk)
        STORE.recovered()  # the store answers again (the lock was momentary)
        await _settled(sync)
        assert [handle.url for handle in registry.snapshot.workers] == ["http://127.0.0.1:9/unlogged"]
        assert sync.full_reloads == 2
    finally:
        remove_local_listener(sync.notify)
        STORE.recovered()
        await sync.astop()


@pytest.mark.django_db(transaction=True)
async def test_two_processes_converge_whatever_order_their_notices_arrive_in() -> None:
    """Two serving processes' syncs (each with its own registry) told of the same changes, one in the
    order they were made and the other in reverse and missing one, end with the snapshot a full
    reload of the store gives; a change numbered but committed after later ones (a slower writer)
    is not skipped by the notices: the process keeps reading the log until it has it."""
    config = GatewayConfig(disable_health_check=True)
    first, second = WorkerRegistry(), WorkerRegistry()
    one, two = RegistrySync(config, registry=first), RegistrySync(config, registry=second)
    try:
        await arun_db(record_change)
        await one.arefresh()
        await two.arefresh()
        workers = [await _ready(f"http://127.0.0.1:9/w{index}") for index in range(4)]
        notices = [await _changed(worker) for worker in workers]
        await Worker.objects.filter(pk=workers[1].pk).aupdate(status=WorkerStatus.PENDING, model_id="m2")
        notices.append(await _changed(workers[1]))
        gone = str(workers[2].pk)
        await workers[2].adelete()
        notices.append(Notice(await arun_db(record_change, gone), gone))
        for notice in notices:
            one.received(notice_message(notice))
        for notice in reversed(notices[1:]):  # the first one lost on the way to the second process
            two.received(notice_message(notice))
        await _settled(one)
        await _settled(two)
        expected, _, _ = await arun_db(_full_reload_view, config)
        assert _view(first.snapshot) == _view(second.snapshot) == expected
        assert one.log_reads == 0 and two.log_reads == 1

        # A slower writer: its change is numbered before a later one but committed after it.
        slow_worker = await _ready("http://127.0.0.1:9/slow")
        slow = await _changed(slow_worker)
        assert slow.seq is not None
        await RegistryChange.objects.filter(seq=slow.seq).adelete()  # not committed yet
        fast_worker = await _ready("http://127.0.0.1:9/fast")
        one.received(notice_message(await _changed(fast_worker)))
        await _settled(one)
        assert one.log_reads == 1  # the notice did not follow on: the log was read
        await RegistryChange.objects.acreate(seq=slow.seq, worker_id=slow_worker.pk)  # it commits
        later = await _ready("http://127.0.0.1:9/later")
        one.received(notice_message(await _changed(later)))  # follows on, but the slow one is missing
        await _settled(one)
        assert one.log_reads == 2
        assert [handle.url for handle in first.snapshot.workers][-3:] == [
            "http://127.0.0.1:9/slow", "http://127.0.0.1:9/fast", "http://127.0.0.1:9/later",
        ]
    finally:
        await one.astop()
        await two.astop()


@pytest.mark.django_db(transaction=True)
def test_a_published_change_tells_listeners_its_number_and_worker() -> None:
    heard: list[Notice] = []
    add_local_listener(heard.append)
    try:
        worker = _worker("http://told:1")
        publish_registry_changed(worker.pk)
        publish_registry_changed()
    finally:
        remove_local_listener(heard.append)
    newest = latest_change()
    assert heard == [Notice(newest - 1, str(worker.pk)), Notice(newest, None)]
    assert parse_notice(notice_message(heard[0])) == heard[0]
    assert parse_notice({"type": "registry.changed"}) == Notice(None, None)  # an earlier gateway's: read the log
    for garbled in ("registry.changed", {"type": "other"}, {"type": "registry.changed", "seq": True},
                    {"type": "registry.changed", "seq": -1}, {"type": "registry.changed", "seq": 3, "worker": 4},
                    {"type": "registry.changed", "seq": 3, "worker": "None"}):
        assert parse_notice(garbled) is None


@pytest.mark.django_db(transaction=True)
async def test_a_change_applied_while_the_first_load_reads_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """At start the command-line workers' jobs tell their changes while the first reload reads the
    fleet: the catch-up they start waits for the reload, so the reload's older read never replaces
    a worker the catch-up applied (a few of 1,000 --worker-urls waited for the safety net, D88)."""
    config = GatewayConfig(disable_health_check=True)
    registry = WorkerRegistry()
    sync = RegistrySync(config, registry=registry)
    sync._loop = asyncio.get_running_loop()
    read, go_on = asyncio.Event(), asyncio.Event()
    load = registry_sync.load_fleet_state

    async def held_arun_db(func: Any, *args: Any) -> Any:
        result = await arun_db(func, *args)
        if func is load and not read.is_set():  # the first load's read, held until the test goes on
            read.set()
            await go_on.wait()
        return result

    monkeypatch.setattr(registry_sync, "arun_db", held_arun_db)
    try:
        await arun_db(record_change)
        first = asyncio.ensure_future(sync.arefresh())
        await read.wait()  # the reload has read the fleet (no worker yet)
        worker = await _ready("http://127.0.0.1:9/during-the-first-load")
        sync.received(notice_message(await _changed(worker)))
        await asyncio.sleep(0.3)  # the catch-up the notice started has had its time (and finished, before)
        go_on.set()
        await first
        await _settled(sync)
        assert [handle.url for handle in registry.snapshot.workers] == ["http://127.0.0.1:9/during-the-first-load"]
    finally:
        go_on.set()
        await sync.astop()
