"""The gateway process's side of the worker registry.

It keeps the data plane's registry snapshot current, by deltas: every committed change names the
worker it touched in the store's change log (administration/notices.py), and this process re-reads
just those workers; a burst of changes shares one read. The notice of a change (from a job in this
process, or over Redis) carries its number and worker: when the notices follow on from the last
change applied, the workers they name are re-read without reading the log; otherwise (a notice
lost, a change made elsewhere, the twice-a-second poll) the log says what changed. A full reload of
the fleet runs at start-up, for a change that is not one worker's (tenant limits, the tokenizer
registry), for a garbled notice, when this process fell behind the log, and every five minutes as
a safety net. Both build the same snapshot.

The process that leads the host (every process of a one-process gateway; one elected process of a
supervised one) also syncs --worker-urls into the store and runs the health checks and the load
monitor (administration/loads.py), per worker by the same deltas. The full reload also loads the
tenant rate limits stored in the console into the data plane's limiter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Any, Iterable

from channels.layers import get_channel_layer
from django.conf import settings

from common.db import STORE_ERRORS, arun_db
from administration.health import HealthChecker, HealthTarget
from administration.host import HostPeers, Leadership, read_load_reports, write_load_reports
from administration.loads import LoadMonitor, LoadTarget
from administration.models import Worker, WorkerStatus
from administration.notices import (
    CHANGE_RETENTION, GROUP, Notice, add_local_listener, changes_since, latest_change, parse_notice, prune_changes,
    remove_local_listener,
)
from administration.tenant_budgets import stored_tenant_budgets
from administration.tenant_limits import stored_tenant_limits
from administration.tokenizer_jobs import tokenizer_entries
from administration.workers import JobStatus, cli_pd_workers, job_of, sync_cli_workers, worker_fields, worker_records
from common.config import GatewayConfig
from common.http_clients import aclose_http_client
from common.outages import REDIS, STORE
from common.ticks import sleep_to_mark
from inference.dataplane import data_plane
from inference.pipeline.tokenizer_registry import TOKENIZERS, TokenizerEntry
from inference.routing.registry import REGISTRY, RegistrySnapshot, WorkerRegistry
from inference.routing.workers import Transport, WorkerKind, WorkerRecord
from inference.served.base import tokenizer_ready

__all__ = [
    "RegistrySync", "FleetState", "WorkerState", "load_fleet_state", "load_worker_states", "fleet_aliases",
    "on_serving_loop",
]  # fmt: skip

log = logging.getLogger(__name__)

FULL_RELOAD_SECS = 300.0  # the safety net: the whole fleet re-read this often
CHANGE_POLL_SECS = 0.5  # how often the store's change log is read (a change is seen within it)
LOAD_FOLLOW_SECS = 1.0  # how often a follower looks for the leader's new load reports
CHANGE_DEBOUNCE_SECS = 0.05  # a notice's read waits this long for the notices that follow it
CHANGE_BATCH = 500  # more changes than this at once: one full reload is cheaper than the deltas
# Changes are numbered when written, not when committed: one numbered before another may become
# visible after it. The read looks back this many numbers behind the newest applied one (skipping
# those applied), so such a change is still seen; the safety net covers any later than that.
CHANGE_OVERLAP = 32
BEHIND_SECS = CHANGE_RETENTION.total_seconds() / 2  # no read of the log for this long: reload instead
WAITING_FOR_STORE = "store"  # /readiness's waiting_for while the first load waits for the store

# The event loop this process's registry sync runs on: the serving loop, where the data plane, the
# health checks and the load monitor use the process's engine clients (their gRPC channels belong
# to it). None before the sync starts and after it stops.
_serving_loop: asyncio.AbstractEventLoop | None = None


def load_tokenizers_of(records: Iterable[WorkerRecord]) -> None:
    """Start loading the tokenizers of these workers that are ready and served by the gateway (not
    loaded or loading yet), in every process: a request, or a /readiness any process may answer,
    then finds them loaded instead of starting the load itself."""
    for record in records:
        if record.status == WorkerStatus.READY:
            tokenizer_ready(record)


def on_serving_loop() -> bool:
    """Whether the running event loop is this process's serving loop, so the data plane's shared
    engine clients may be used here (a view run on a loop of its own makes short-lived ones)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return running is _serving_loop


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One registered worker as this process needs it: its record, the aliases its model cards
    give, its health-check and load-poll targets (None: not checked or not polled), and for GET
    /workers its API fields but for live state, its job and the models it serves (not the row it was
    read from: at 1,000 workers the rows were a few MiB of the process's memory)."""

    record: WorkerRecord
    fields: dict[str, Any]
    job: JobStatus | None = None
    aliases: tuple[tuple[str, str], ...] = ()
    health: HealthTarget | None = None
    load: LoadTarget | None = None
    model_ids: tuple[str, ...] = ()


@dataclass(slots=True)
class FleetState:
    """One read of the store: the registered workers in registration order (all of them, or those
    asked for), and with a full read the tenant limits and budgets and the newest change number read
    first (a change during the read is seen by the next read of the log)."""

    workers: dict[str, WorkerState]
    tenant_limits: dict[str, int] = field(default_factory=dict)
    version: int = 0
    tokenizers: list[TokenizerEntry] = field(default_factory=list)  # the registry's completed loads
    tenant_budgets: dict[str, str] = field(default_factory=dict)  # tenant -> TOKENS/day|month

    @property
    def records(self) -> list[WorkerRecord]:
        return [state.record for state in self.workers.values()]

    @property
    def health(self) -> list[HealthTarget]:
        return [state.health for state in self.workers.values() if state.health is not None]

    @property
    def loads(self) -> list[LoadTarget]:
        return [state.load for state in self.workers.values() if state.load is not None]


def _health_target(worker: Worker, config: GatewayConfig, record: WorkerRecord) -> HealthTarget | None:
    """Relayed (HTTP) workers are probed at --health-check-endpoint, engine workers by their engine
    client's health check (the target carries their record); external providers are not checked."""
    block: dict[str, Any] = worker.setting("health", {})
    disabled = block.get("disable_health_check", config.disable_health_check) and record.transport is not Transport.ZMQ
    if disabled or record.kind is WorkerKind.PROVIDER:  # ZMQ health checks stay on (spec 3)
        return None
    if worker.status not in (WorkerStatus.PENDING, WorkerStatus.READY, WorkerStatus.NOT_READY):
        return None
    return HealthTarget(
        worker_id=str(worker.pk),
        url=worker.url,
        api_key=record.api_key,
        status=worker.status,
        endpoint=config.health_check_endpoint,
        timeout_secs=float(block.get("timeout_secs", config.health_check_timeout_secs)),
        interval_secs=float(block.get("check_interval_secs", config.health_check_interval_secs)) or 1.0,
        success_threshold=max(1, int(block.get("success_threshold", config.health_success_threshold))),
        failure_threshold=max(1, int(block.get("failure_threshold", config.health_failure_threshold))),
        worker_type=worker.worker_type,
        engine=record if record.kind is WorkerKind.ENGINE else None,
    )


def _load_target(worker: Worker, config: GatewayConfig, record: WorkerRecord) -> LoadTarget | None:
    """Ready self-hosted workers are polled for load (engine workers through their engine client:
    the target carries their record); the overload block (either field turns protection on) falls
    back to the --worker-overload-* flags."""
    if worker.status != WorkerStatus.READY or record.kind is WorkerKind.PROVIDER:
        return None
    block: dict[str, Any] = worker.setting("overload", {}) or {}
    waiting: int | None = None
    usage: float | None = None
    if block.get("waiting_requests") or block.get("token_usage") or config.worker_overload_protection:
        waiting = block.get("waiting_requests") or config.worker_overload_waiting_requests or None
        usage = block.get("token_usage") or (config.worker_overload_token_usage if config.worker_overload_protection else None)
    return LoadTarget(
        worker_id=str(worker.pk),
        url=worker.url,
        api_key=record.api_key,
        worker_type=worker.worker_type,
        runtime_type=worker.runtime_type,
        waiting_requests=None if waiting is None else int(waiting),
        token_usage=None if usage is None else float(usage),
        engine=record if record.kind is WorkerKind.ENGINE else None,
    )


def _worker_states(config: GatewayConfig, workers: list[Worker]) -> dict[str, WorkerState]:
    states: dict[str, WorkerState] = {}
    for worker, record in zip(workers, worker_records(config, workers)):
        aliases = tuple((alias, card["id"]) for card in worker.model_cards for alias in card.get("aliases", []))
        states[record.id] = WorkerState(
            record, worker_fields(worker, config), job_of(worker), aliases,
            _health_target(worker, config, record), _load_target(worker, config, record),
            tuple(worker.model_ids()),
        )
    return states


def load_fleet_state(config: GatewayConfig) -> FleetState:
    """The whole fleet, the tenant limits and budgets and the registered tokenizers, with the newest
    change number read first."""
    version = latest_change()
    workers = list(Worker.objects.listed())  # one read: records and targets come from the same rows
    return FleetState(
        _worker_states(config, workers), stored_tenant_limits(), version, tokenizer_entries(), stored_tenant_budgets()
    )


def load_worker_states(config: GatewayConfig, worker_ids: Iterable[str]) -> dict[str, WorkerState]:
    """These workers as the store has them now (an id that is not there any more is left out)."""
    return _worker_states(config, list(Worker.objects.listed().filter(pk__in=list(worker_ids))))


def _order(state: WorkerState) -> tuple[float, str]:
    return state.record.order


def fleet_aliases(config: GatewayConfig, ordered: Iterable[WorkerState]) -> dict[str, str]:
    """The --model-aliases, then each worker's model-card aliases in registration order (the first
    worker to claim an alias keeps it)."""
    aliases = dict(config.model_aliases)
    for state in ordered:
        for alias, model in state.aliases:
            aliases.setdefault(alias, model)
    return aliases


class RegistrySync:
    """This process's registry snapshot kept in step with the store. ``peers`` (a supervised
    gateway's serving processes) makes the host's control loops (command-line registrations, health
    checks, the load monitor) run in the elected leader only; without it this process leads.
    ``registry`` is the process's (REGISTRY) unless a test runs several syncs in one process."""

    def __init__(self, config: GatewayConfig, peers: HostPeers | None = None, registry: WorkerRegistry | None = None) -> None:
        self.config = config
        self.peers = peers
        self.registry = REGISTRY if registry is None else registry
        self.health = HealthChecker(self._status_changed)
        self.loads = LoadMonitor(config.load_monitor_interval)
        self.leadership = Leadership(peers.lock_path, self._lead) if peers is not None else None
        self.leading = peers is None
        self.full_reloads = 0  # how many times the whole fleet was read
        self.deltas = 0  # how many workers were re-read one by one (tests tell deltas from reloads by these)
        self.log_reads = 0  # how many times the change log was read for them (the others came from notices)
        self._states: dict[str, WorkerState] = {}  # what the snapshot was built from
        self._ordered: list[WorkerState] = []  # the same, in registration order
        self._listing: tuple[WorkerState, ...] | None = None  # the same, as other threads may read it
        # The change log as applied: every change up to ``_floor`` is, and those numbered in ``_seen``
        # above it; ``_cursor`` is the newest applied.
        self._floor = self._cursor = -1
        self._seen: set[int] = set()
        self._read_at = 0.0  # monotonic time of the last read of the log
        self._noticed: dict[int, str | None] = {}  # notices not applied yet: change number -> worker
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._syncing: asyncio.Task[None] | None = None
        # One reload or catch-up at a time: the first load's reload (at start, while the command-line
        # workers' jobs already tell their changes) ran beside a catch-up, and replaced the workers
        # the catch-up had applied with its older read while keeping the catch-up's place in the log
        # (a few of 1,000 --worker-urls unrouted until the safety net, D84, D88).
        self._applying = asyncio.Lock()
        self._dirty = False
        self._reload_wanted = False
        self._follower: asyncio.Task[None] | None = None
        if peers is not None:
            self.loads.after_poll = self._share_load_reports

    async def astart(self) -> RegistrySnapshot:
        """Lead or follow, publish the first snapshot, start background work. A store that does not
        answer does not stop the start: the snapshot stays empty, /readiness says it waits for the
        store, and the first load (with the command-line registrations) runs as soon as it answers."""
        global _serving_loop
        self._loop = _serving_loop = asyncio.get_running_loop()
        add_local_listener(self.notify)
        if self.leadership is not None and self.leadership.try_acquire():
            self.leading = self.leadership.leader = True
            log.info("this process leads the host's health checks, registrations and load polls")
        try:
            return await self._first_load()
        except STORE_ERRORS:  # the outage is logged once (common.outages.STORE)
            data_plane().waiting_for = WAITING_FOR_STORE
            self.registry.awaiting_first_load()
            log.warning("started without the store: no worker is routable and /readiness answers 503 until the "
                        "registry is loaded from it")
            self._tasks.append(asyncio.ensure_future(self._load_when_the_store_answers()))
            return self.registry.snapshot

    async def _load_when_the_store_answers(self) -> None:
        """Try the first load every STORE.retry_secs until the store answers (a store that answers
        with another error, such as tables not migrated yet, is logged once and tried again)."""
        reported = False
        while True:
            await asyncio.sleep(STORE.retry_secs)
            try:
                snapshot = await self._first_load()
            except STORE_ERRORS:
                continue
            except Exception:
                if not reported:
                    log.exception("loading the registry from the store failed; trying again until it loads")
                    reported = True
                continue
            data_plane().waiting_for = None
            log.info("registry loaded from the store: %d worker(s) registered", len(snapshot.workers))
            return

    async def _first_load(self) -> RegistrySnapshot:
        """The command-line registrations (by the leader) and the first snapshot, then the loops."""
        if self.leading:
            await arun_db(sync_cli_workers, self.config.worker_urls, self.config.backend, cli_pd_workers(self.config))
        snapshot = await self.arefresh()
        if self.leading:
            self.loads.start()
        elif self.leadership is not None:
            self._tasks.append(asyncio.ensure_future(self.leadership.run()))
            self._follower = asyncio.ensure_future(self._follow_load_reports())
            self._tasks.append(self._follower)
        self._tasks.append(asyncio.ensure_future(self._periodic_reload()))
        self._tasks.append(asyncio.ensure_future(self._poll_changes()))
        if getattr(settings, "REDIS_URL", None):
            self._tasks.append(asyncio.ensure_future(self._listen()))
        return snapshot

    async def _lead(self) -> None:
        """Elected after the leader left: take over its control loops (not while shutting down)."""
        if data_plane().draining:
            return
        self.leading = True
        if self._follower is not None:
            self._follower.cancel()
        while True:  # the store may be down as the leader changes: try until it is back
            try:
                await arun_db(sync_cli_workers, self.config.worker_urls, self.config.backend, cli_pd_workers(self.config))
                break
            except STORE_ERRORS:  # logged once as an outage
                await asyncio.sleep(STORE.retry_secs)
        self._schedule_sync(reload=True)  # the reload that starts the health checks, in turn with any other
        self.loads.start()

    async def astop(self) -> None:
        global _serving_loop
        if _serving_loop is self._loop:
            _serving_loop = None
        remove_local_listener(self.notify)
        tasks = [*self._tasks, *([self._syncing] if self._syncing else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        await self.health.aclose()
        await self.loads.aclose()
        if self.leadership is not None:
            self.leadership.release()
        await aclose_http_client()

    async def arefresh(self) -> RegistrySnapshot:
        """Reload the whole fleet (and the tenant limits) from the store."""
        async with self._applying:
            return await self._reload()

    async def _reload(self) -> RegistrySnapshot:
        state = await arun_db(load_fleet_state, self.config)
        self.full_reloads += 1
        self._states = state.workers
        self._ordered = list(state.workers.values())
        self._listing = tuple(self._ordered)
        snapshot = self.registry.publish(state.records, fleet_aliases(self.config, state.workers.values()))
        self._floor = self._cursor = max(self._cursor, state.version)
        self._seen = {seq for seq in self._seen if seq > self._floor}
        self._read_at = time.monotonic()
        data_plane().install_tenant_limits(state.tenant_limits)
        data_plane().install_tenant_budgets(state.tenant_budgets)
        data_plane().engines.retain(self._states)
        TOKENIZERS.publish(state.tokenizers)
        load_tokenizers_of(state.records)
        if self.leading:
            self.health.reconcile(state.health)
            self.loads.reconcile(state.loads)
        return snapshot

    async def acatch_up(self) -> RegistrySnapshot:
        """Apply the changes past the last one applied: re-read just the workers they name. Notices
        that follow on from the last change applied say which (no read of the log); otherwise the
        store's log does (a full reload when a change is not a worker's, when there are many, or
        when this process fell behind the log)."""
        async with self._applying:
            return await self._catch_up()

    async def _catch_up(self) -> RegistrySnapshot:
        noticed, self._noticed = self._noticed, {}
        behind = time.monotonic() - self._read_at > BEHIND_SECS
        following = None if behind else self._following(noticed)
        if following is not None:
            if not following:  # every noticed change is applied already
                return self.registry.snapshot
            snapshot = await self.aapply({worker_id for _, worker_id in following if worker_id is not None})
            self._floor = self._cursor = following[-1][0]
            self._seen.clear()
            self._read_at = time.monotonic()
            return snapshot
        since = max(self._floor, self._cursor - CHANGE_OVERLAP)
        rows = await arun_db(changes_since, since, CHANGE_BATCH)
        self.log_reads += 1
        fresh = [(seq, worker_id) for seq, worker_id in rows if seq not in self._seen]
        if behind or len(rows) >= CHANGE_BATCH or any(worker_id is None for _, worker_id in fresh):
            log.debug("full reload: %s", "behind the change log" if behind else
                      f"{len(rows)} changes" if len(rows) >= CHANGE_BATCH else "a change not of one worker")
            return await self._reload()
        self._read_at = time.monotonic()
        if not fresh:
            return self.registry.snapshot
        ids = {worker_id for _, worker_id in fresh if worker_id is not None}
        snapshot = await self.aapply(ids)
        self._seen.update(seq for seq, _ in fresh)
        self._cursor = max(self._cursor, *(seq for seq, _ in fresh))
        self._floor = max(self._floor, self._cursor - CHANGE_OVERLAP)
        self._seen = {seq for seq in self._seen if seq > self._floor}
        return snapshot

    def _following(self, noticed: dict[int, str | None]) -> list[tuple[int, str | None]] | None:
        """The noticed changes not applied yet, oldest first, when they are every change after the
        last one applied and each names a worker; else None (the log must be read). Every change up
        to the last one applied must be applied too: a change the log skipped (numbered, not
        committed yet) keeps the log's overlap reading until it is seen."""
        if not noticed or self._cursor < 0 or len(self._seen) != self._cursor - self._floor:
            return None
        following = sorted(
            (seq, worker_id) for seq, worker_id in noticed.items() if seq > self._floor and seq not in self._seen
        )
        if not following:
            return following
        first, last = following[0][0], following[-1][0]
        if first != self._cursor + 1 or last - first != len(following) - 1:
            return None  # a change not noticed here (lost, or made elsewhere) lies between
        if any(worker_id is None for _, worker_id in following):
            return None
        return following

    async def aapply(self, worker_ids: set[str]) -> RegistrySnapshot:
        """Re-read these workers from the store and change just them (a worker not there left)."""
        found = await arun_db(load_worker_states, self.config, worker_ids)
        self.deltas += len(worker_ids)
        states, ordered = self._states, self._ordered
        aliases_moved = left = False
        for worker_id in worker_ids:
            state = found.get(worker_id)
            previous = states.pop(worker_id, None)
            aliases_moved = aliases_moved or bool(previous is not None and previous.aliases) or bool(state and state.aliases)
            if previous is not None:  # out of the order, found by its place (a registration finishing late
                index = bisect_left(ordered, previous.record.order, key=_order)  # takes its place in it)
                while ordered[index] is not previous:
                    index += 1
                del ordered[index]
                left = left or state is None
            if state is not None:
                states[worker_id] = state
                insort(ordered, state, key=_order)
        self._listing = tuple(ordered)
        snapshot = self.registry.apply(
            {worker_id: state.record if (state := found.get(worker_id)) else None for worker_id in worker_ids},
            fleet_aliases(self.config, ordered) if aliases_moved else None,  # the order of claims counts
        )
        if left:
            data_plane().engines.retain(states)
        load_tokenizers_of(found[worker_id].record for worker_id in worker_ids if worker_id in found)
        if self.leading:
            for worker_id in worker_ids:
                state = found.get(worker_id)
                self.health.update(worker_id, None if state is None else state.health)
                self.loads.update(worker_id, None if state is None else state.load)
        return snapshot

    def current_listing(self) -> tuple[WorkerState, ...] | None:
        """Every registered worker in registration order, as read from the store, when this process
        has applied every change the store has recorded (one indexed read tells); else None. Any
        thread may call it (it reads the store)."""
        listing = self._listing
        if listing is None or latest_change() > self._cursor:
            return None
        return listing

    async def _status_changed(self, worker_id: str, status: WorkerStatus) -> None:
        """A health check here moved a worker: route by it at once; the change's notice brings the
        rest (its load target) with the worker's re-read."""
        snapshot = self.registry.publish_status(worker_id, status)
        if snapshot is not None:
            load_tokenizers_of(handle.record for handle in snapshot.routable if handle.id == worker_id)
        self._schedule_sync()

    def notify(self, notice: Notice | None = None) -> None:
        """Called from any thread (jobs) with a change's notice: apply it soon, once for a burst."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._noticed_change, notice)

    def received(self, message: Any) -> None:
        """A notice from another process over the channel layer (on the serving loop)."""
        notice = parse_notice(message)
        if notice is None:  # garbled: what it said is unknown, so the whole fleet is read
            log.warning("a garbled registry notice arrived; reloading the fleet")
            self._schedule_sync(reload=True)
        else:
            self._noticed_change(notice)

    def _noticed_change(self, notice: Notice | None) -> None:
        """Keep what a notice names for the next catch-up. A notice without a number tells of a change
        the store could not record in its log (it refused the write: down, or locked under a burst
        of registrations) or of one a gateway that does not number them made: the log may not have
        it, so the whole fleet is read (once the store answers)."""
        if notice is None or notice.seq is None:
            self._schedule_sync(reload=True)
            return
        if notice.seq <= self._floor or notice.seq in self._seen:
            return  # applied already (by the log or a reload)
        self._noticed[notice.seq] = notice.worker_id
        self._schedule_sync()

    def _schedule_sync(self, *, reload: bool = False) -> None:
        self._reload_wanted = self._reload_wanted or reload
        if self._syncing is not None and not self._syncing.done():
            self._dirty = True
            return
        self._syncing = asyncio.ensure_future(self._sync_until_clean())

    async def _sync_until_clean(self) -> None:
        while True:
            # Let a burst of notices (registrations one after another, health transitions) gather
            # into one read of the log.
            await asyncio.sleep(CHANGE_DEBOUNCE_SECS)
            self._dirty = False
            reload, self._reload_wanted = self._reload_wanted, False
            try:
                if reload:
                    await self.arefresh()
                else:
                    await self.acatch_up()
            except STORE_ERRORS:  # logged once as an outage; the change poll asks again when it is back
                self._reload_wanted = self._reload_wanted or reload
            except Exception:
                log.exception("registry refresh failed")
            if not self._dirty:
                return

    async def _periodic_reload(self) -> None:
        """The safety net: the whole fleet re-read every FULL_RELOAD_SECS; the leader also deletes
        the log's old changes."""
        while True:
            await sleep_to_mark(FULL_RELOAD_SECS)
            self._schedule_sync(reload=True)
            if self.leading:
                try:
                    await arun_db(prune_changes)
                except Exception:
                    log.debug("pruning the registry change log failed", exc_info=True)

    async def _poll_changes(self) -> None:
        """Read the change log when it moved past what this process applied (a change made
        anywhere: another process, a command, a Celery job, a health transition of the leader)."""
        while True:
            await sleep_to_mark(CHANGE_POLL_SECS)
            if self._syncing is not None and not self._syncing.done():
                continue  # a read already on its way sees the log itself
            try:
                newest = await arun_db(latest_change)
            except Exception:
                log.debug("registry change poll failed", exc_info=True)
                continue
            if newest > self._cursor or self._reload_wanted:  # a reload the store's outage put off
                self._schedule_sync()

    async def _share_load_reports(self) -> None:
        """The leader hands its load reports to the other processes after each poll."""
        assert self.peers is not None
        await asyncio.to_thread(write_load_reports, self.peers.loads_path, self.registry)

    async def _follow_load_reports(self) -> None:
        """A follower reads the leader's load reports when they change."""
        assert self.peers is not None
        seen = 0.0
        while True:
            await sleep_to_mark(LOAD_FOLLOW_SECS)
            try:
                seen = read_load_reports(self.peers.loads_path, self.registry, seen)
            except Exception:
                log.debug("reading the leader's load reports failed", exc_info=True)

    async def _listen(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        from redis.exceptions import RedisError  # with REDIS_URL only (redis imports OpenTelemetry's SDK; D118)

        while True:
            try:
                channel = await layer.new_channel()
                await layer.group_add(GROUP, channel)
                REDIS.recovered()
                while True:
                    self.received(await layer.receive(channel))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:  # Redis down (logged once): the change poll carries on
                REDIS.failed(exc)
                await asyncio.sleep(REDIS.retry_secs)
            except Exception:
                log.warning("registry notice listener failed; retrying", exc_info=True)
                await asyncio.sleep(REDIS.retry_secs)
