"""The gateway process's side of the worker registry.

It keeps the data plane's registry snapshot current: it rebuilds it from the database when a job in
this process says so, when the store's registry version moves (a change made in any process), when a
notice arrives over the Channels layer (with Redis), and every few seconds as a safety net; a burst
of notices shares one reload. The process that leads the host (every process of a one-process
gateway; one elected process of a supervised one) also syncs --worker-urls into the store and runs
the health checks and the load monitor (administration/loads.py). The same read loads the tenant
rate limits stored in the console into the data plane's limiter.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from administration.db import arun_db
from administration.health import HealthChecker, HealthTarget
from administration.host import HostPeers, Leadership, read_load_reports, write_load_reports
from administration.loads import LoadMonitor, LoadTarget
from administration.models import Worker, WorkerStatus
from administration.notices import GROUP, add_local_listener, registry_version, remove_local_listener
from administration.tenant_limits import stored_tenant_limits
from administration.workers import sync_cli_workers, worker_records
from common.config import GatewayConfig
from common.http_clients import aclose_http_client
from inference.dataplane import data_plane
from inference.routing.registry import REGISTRY, RegistrySnapshot
from inference.routing.workers import RuntimeType, Transport, WorkerRecord, transport_of

__all__ = ["RegistrySync", "FleetState", "load_fleet_state"]

log = logging.getLogger(__name__)

REFRESH_SECS = 5.0
VERSION_POLL_SECS = 0.5  # how often the store's registry version is read (a change is seen within it)
LOAD_FOLLOW_SECS = 1.0  # how often a follower looks for the leader's new load reports
REFRESH_DEBOUNCE_SECS = 0.2  # a notice's reload waits this long for the notices that follow it


class FleetState:
    def __init__(
        self,
        records: list[WorkerRecord],
        aliases: dict[str, str],
        health: list[HealthTarget],
        loads: list[LoadTarget] | None = None,
        tenant_limits: dict[str, int] | None = None,
        version: int = 0,
    ) -> None:
        self.records = records
        self.aliases = aliases
        self.health = health
        self.loads = loads or []
        self.tenant_limits = tenant_limits or {}  # stored rate limits: tenant -> requests per minute
        self.version = version  # the store's registry version, read before everything else


def _health_target(worker: Worker, config: GatewayConfig, api_key: str | None) -> HealthTarget | None:
    block: dict[str, Any] = worker.setting("health", {})
    disabled = block.get("disable_health_check", config.disable_health_check)
    if disabled or worker.runtime_type == RuntimeType.EXTERNAL or transport_of(worker.url) is Transport.ZMQ:
        return None
    if worker.status not in (WorkerStatus.PENDING, WorkerStatus.READY, WorkerStatus.NOT_READY):
        return None
    return HealthTarget(
        worker_id=str(worker.pk),
        url=worker.url,
        api_key=api_key,
        status=worker.status,
        endpoint=config.health_check_endpoint,
        timeout_secs=float(block.get("timeout_secs", config.health_check_timeout_secs)),
        interval_secs=float(block.get("check_interval_secs", config.health_check_interval_secs)) or 1.0,
        success_threshold=max(1, int(block.get("success_threshold", config.health_success_threshold))),
        failure_threshold=max(1, int(block.get("failure_threshold", config.health_failure_threshold))),
        worker_type=worker.worker_type,
    )


def _load_target(worker: Worker, config: GatewayConfig, api_key: str | None) -> LoadTarget | None:
    """Ready self-hosted HTTP workers are polled for load; the overload block (either field turns
    protection on) falls back to the --worker-overload-* flags."""
    if worker.status != WorkerStatus.READY or worker.runtime_type == RuntimeType.EXTERNAL:
        return None
    if transport_of(worker.url) is not Transport.HTTP:
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
        api_key=api_key,
        worker_type=worker.worker_type,
        runtime_type=worker.runtime_type,
        waiting_requests=None if waiting is None else int(waiting),
        token_usage=None if usage is None else float(usage),
    )


def load_fleet_state(config: GatewayConfig) -> FleetState:
    """One read of the store: registry records, aliases, health-check and load targets, tenant limits,
    and the registry version first (a change during the read is seen by the next poll)."""
    version = registry_version()
    workers = list(Worker.objects.listed())  # one read: records and targets come from the same rows
    records = worker_records(config, workers)
    aliases = dict(config.model_aliases)
    targets = []
    loads = []
    for worker, record in zip(workers, records):
        for card in worker.model_cards:
            for alias in card.get("aliases", []):
                aliases.setdefault(alias, card["id"])
        target = _health_target(worker, config, record.api_key)
        if target is not None:
            targets.append(target)
        load_target = _load_target(worker, config, record.api_key)
        if load_target is not None:
            loads.append(load_target)
    return FleetState(records, aliases, targets, loads, stored_tenant_limits(), version)


class RegistrySync:
    """This process's registry snapshot kept in step with the store. ``peers`` (a supervised
    gateway's serving processes) makes the host's control loops (command-line registrations, health
    checks, the load monitor) run in the elected leader only; without it this process leads."""

    def __init__(self, config: GatewayConfig, peers: HostPeers | None = None) -> None:
        self.config = config
        self.peers = peers
        self.health = HealthChecker(self._status_changed)
        self.loads = LoadMonitor(config.load_monitor_interval)
        self.leadership = Leadership(peers.lock_path, self._lead) if peers is not None else None
        self.leading = peers is None
        self._version = -1  # the store's registry version the snapshot was read at
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._refreshing: asyncio.Task[None] | None = None
        self._dirty = False
        self._follower: asyncio.Task[None] | None = None
        if peers is not None:
            self.loads.after_poll = self._share_load_reports

    async def astart(self) -> RegistrySnapshot:
        """Lead or follow, publish the first snapshot, start background work."""
        self._loop = asyncio.get_running_loop()
        add_local_listener(self.notify)
        if self.leadership is not None and self.leadership.try_acquire():
            self.leading = self.leadership.leader = True
            log.info("this process leads the host's health checks, registrations and load polls")
        if self.leading:
            await arun_db(sync_cli_workers, self.config.worker_urls)
        snapshot = await self.arefresh()
        if self.leading:
            self.loads.start()
        elif self.leadership is not None:
            self._tasks.append(asyncio.ensure_future(self.leadership.run()))
            self._follower = asyncio.ensure_future(self._follow_load_reports())
            self._tasks.append(self._follower)
        self._tasks.append(asyncio.ensure_future(self._periodic_refresh()))
        self._tasks.append(asyncio.ensure_future(self._watch_version()))
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
        await arun_db(sync_cli_workers, self.config.worker_urls)
        await self.arefresh()
        self.loads.start()

    async def astop(self) -> None:
        remove_local_listener(self.notify)
        tasks = [*self._tasks, *([self._refreshing] if self._refreshing else [])]
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
        state = await arun_db(load_fleet_state, self.config)
        snapshot = REGISTRY.publish(state.records, state.aliases)
        self._version = state.version
        data_plane().install_tenant_limits(state.tenant_limits)
        if self.leading:
            self.health.reconcile(state.health)
            self.loads.reconcile(state.loads)
        return snapshot

    async def _status_changed(self, worker_id: str, status: WorkerStatus) -> None:
        """A health check here moved a worker: route by it at once, and reload soon (once for a burst
        of transitions) for what follows from it (load targets)."""
        REGISTRY.publish_status(worker_id, status)
        self._schedule_refresh()

    def notify(self) -> None:
        """Called from any thread (jobs): rebuild the snapshot soon, once for a burst of notices."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._schedule_refresh)

    def _schedule_refresh(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            self._dirty = True
            return
        self._refreshing = asyncio.ensure_future(self._refresh_until_clean())

    async def _refresh_until_clean(self) -> None:
        while True:
            # Let a burst of notices (registrations one after another, health transitions) gather
            # into one reload of the fleet instead of one reload each.
            await asyncio.sleep(REFRESH_DEBOUNCE_SECS)
            self._dirty = False
            try:
                await self.arefresh()
            except Exception:
                log.exception("registry refresh failed")
            if not self._dirty:
                return

    async def _periodic_refresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECS)
            self._schedule_refresh()

    async def _watch_version(self) -> None:
        """Refresh when the store's registry version moved past the snapshot's (a change made
        anywhere: another process, a command, a Celery job, a health transition of the leader)."""
        while True:
            await asyncio.sleep(VERSION_POLL_SECS)
            try:
                version = await arun_db(registry_version)
            except Exception:
                log.debug("registry version poll failed", exc_info=True)
                continue
            # A reload already on its way reads the version itself; a change after that read is
            # seen by the next poll.
            pending = self._refreshing is not None and not self._refreshing.done()
            if version != self._version and not pending:
                self._schedule_refresh()

    async def _share_load_reports(self) -> None:
        """The leader hands its load reports to the other processes after each poll."""
        assert self.peers is not None
        await asyncio.to_thread(write_load_reports, self.peers.loads_path, REGISTRY)

    async def _follow_load_reports(self) -> None:
        """A follower reads the leader's load reports when they change."""
        assert self.peers is not None
        seen = 0.0
        while True:
            await asyncio.sleep(LOAD_FOLLOW_SECS)
            try:
                seen = read_load_reports(self.peers.loads_path, REGISTRY, seen)
            except Exception:
                log.debug("reading the leader's load reports failed", exc_info=True)

    async def _listen(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        while True:
            try:
                channel = await layer.new_channel()
                await layer.group_add(GROUP, channel)
                while True:
                    await layer.receive(channel)
                    self._schedule_refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("registry notice listener failed; retrying", exc_info=True)
                await asyncio.sleep(1.0)
