"""Worker discovery's common part (D73): what a provider found, made the store's fleet.

A provider (administration/pod_discovery.py: Kubernetes pods; administration/file_discovery.py: a
manifest file) reports the whole set of workers it sees, by discovery id, whenever that set may have
changed. :class:`DiscoveryRunner` then reconciles the store with it, in one pass: a found worker the
store lacks is registered, a stored one the provider no longer reports (or reports changed) is
drained and removed (reason ``reconciled``). Both go through the admin API's own functions
(administration/workers.py ``create_worker`` and ``remove_worker``), so registration jobs, health
checks, breakers, metrics and the console treat discovered workers as any other.

The workers discovery owns carry its labels: ``discovery_provider``, ``discovery_id`` and
``discovery_spec`` (a digest of what the provider said of the worker, to tell a changed one). A
worker registered through the API or --worker-urls has none and is never touched, even at a URL a
provider reports.

Only one process per gateway host runs discovery: the elected leader (administration/host.py), as
for --worker-urls. Several gateway hosts sharing a store each run it; the store keeps that safe:
a URL is registered once (a second registration of it is refused and taken as done), and a removal
already running for a worker is not started again. Hosts sharing a store must run the same
discovery flags: the store holds one discovered fleet.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Protocol

import orjson
from django.db import transaction
from django.utils import timezone

from common.db import STORE_ERRORS, arun_db
from administration.models import JobState, JobType, Worker, WorkerSource, WorkerType
from administration.worker_spec import SpecRuleError, SpecTypeError, WorkerSpec, parse_worker_spec
from administration.workers import (
    WorkerAlreadyExists, WorkerCreateInProgress, WorkerNotFound, create_workers, remove_worker,
)
from common import telemetry
from common.config import current_config
from common.outages import STORE

__all__ = [
    "DiscoveredWorker", "DiscoveryProvider", "DiscoveryRunner", "PassResult", "reconcile",
    "PROVIDER_LABEL", "ID_LABEL", "SPEC_LABEL",
]

log = logging.getLogger(__name__)

PROVIDER_LABEL = "discovery_provider"
ID_LABEL = "discovery_id"
SPEC_LABEL = "discovery_spec"

RESYNC_SECS = 30.0  # a pass at least this often: a registration that failed is tried again
REGISTER_BATCH = 200  # found workers reserved with one store write (a thousand pods: five writes)
DEBOUNCE_SECS = 0.2  # a burst of changes (a rollout, a relist) is reconciled in one pass
DEFERRED_RETRY_SECS = 1.0  # a pass that had to wait for a removal runs again this soon
LEADER_POLL_SECS = 1.0  # a process that does not lead looks this often whether it was elected
REMOVAL_SLACK = timedelta(seconds=60)  # a removal job older than its drain plus this was lost: started again


@dataclass(frozen=True, slots=True)
class DiscoveredWorker:
    """One worker a provider reports: its discovery id (a pod's ``<uid>:<port>``, a manifest entry's
    id) and the spec fields it gives."""

    discovery_id: str
    url: str
    worker_type: str = WorkerType.REGULAR
    bootstrap_port: int | None = None
    model_id: str | None = None
    kv_connector: str | None = None
    kv_role: str | None = None
    kv_engine_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # e.g. the pod's name and uid

    def spec_body(self, provider: str) -> dict[str, Any]:
        """The POST /workers body that registers it."""
        labels = dict(self.labels)
        if self.model_id:
            labels["served_model_name"] = self.model_id  # the worker's model id (administration/registration.py)
        if self.kv_role:
            labels["kv_role"] = self.kv_role
        body: dict[str, Any] = {"url": self.url, "worker_type": str(self.worker_type)}
        for name in ("bootstrap_port", "kv_connector", "kv_engine_id"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        digest = hashlib.sha256(orjson.dumps({**body, "labels": labels}, option=orjson.OPT_SORT_KEYS)).hexdigest()
        body["labels"] = {**labels, PROVIDER_LABEL: provider, ID_LABEL: self.discovery_id, SPEC_LABEL: digest[:16]}
        return body


@dataclass(frozen=True, slots=True)
class PassResult:
    discovered: int
    registered: int = 0
    failed: int = 0
    removed: int = 0
    deferred: bool = False  # a found worker waits for the removal of the one holding its URL


def _removal_running(row: Worker, settle_secs: float) -> bool:
    if row.job_type != JobType.REMOVE or row.job_state not in (JobState.PENDING, JobState.PROCESSING):
        return False
    moved = row.job_updated_at
    return moved is not None and timezone.now() - moved < timedelta(seconds=settle_secs) + REMOVAL_SLACK


def _removed(row: Worker) -> bool:
    """Start the worker's removal unless another job started on it since ``row`` was read (another
    gateway host's removal): the claim is a conditional write on the job generation read, so of two
    hosts removing the same worker at once one waits for the other and then finds it claimed."""
    with transaction.atomic():
        claimed = Worker.objects.filter(pk=row.pk, job_generation=row.job_generation).update(job_updated_at=timezone.now())
        if not claimed:
            return False
        try:
            remove_worker(row.pk)
        except WorkerNotFound:
            return False
    return True


def reconcile(provider: str, found: Mapping[str, DiscoveredWorker]) -> PassResult:
    """Make the store's ``provider``-discovered workers those ``found`` (sync: a job thread)."""
    config = current_config()
    rows = list(Worker.objects.order_by().only(
        "id", "url", "labels", "job_type", "job_state", "job_updated_at", "job_generation"
    ))
    owned: dict[str, Worker] = {}
    by_url: dict[str, Worker] = {}
    removed = 0
    for row in rows:
        by_url[row.url] = row
        labels = row.labels or {}
        if labels.get(PROVIDER_LABEL) != provider:
            continue
        wanted = found.get(str(labels.get(ID_LABEL)))
        bodies_match = wanted is not None and wanted.url == row.url and (
            wanted.spec_body(provider)["labels"][SPEC_LABEL] == labels.get(SPEC_LABEL)
        )
        if bodies_match and str(labels.get(ID_LABEL)) not in owned:
            owned[str(labels[ID_LABEL])] = row
            continue
        if _removal_running(row, config.drain_settle_secs) or not _removed(row):
            continue
        log.info("discovery (%s): %s is gone or changed; draining and removing it", provider, row.url)
        removed += 1
    registered = failed = 0
    deferred = False
    batch: list[tuple[str, DiscoveredWorker, WorkerSpec]] = []
    for discovery_id, wanted in found.items():
        if discovery_id in owned:
            continue
        holder = by_url.get(wanted.url)
        if holder is not None:
            if (holder.labels or {}).get(PROVIDER_LABEL) == provider:
                deferred = True  # the worker it replaces is being removed: registered after it
            else:
                log.debug("discovery (%s): %s is registered otherwise; left as it is", provider, wanted.url)
            continue
        try:
            spec = parse_worker_spec(wanted.spec_body(provider))
        except (SpecRuleError, SpecTypeError) as exc:
            log.warning("discovery (%s): cannot register %s: %s", provider, wanted.url, exc)
            failed += 1
            continue
        batch.append((discovery_id, wanted, spec))
    for start in range(0, len(batch), REGISTER_BATCH):
        part = batch[start:start + REGISTER_BATCH]
        for (discovery_id, wanted, _), outcome in zip(part, create_workers([spec for _, _, spec in part])):
            if isinstance(outcome, (WorkerAlreadyExists, WorkerCreateInProgress)):
                continue  # another gateway host registered it first: the next pass sees it as found
            if isinstance(outcome, Exception):  # its job could not be queued (the job queue unavailable)
                log.warning("discovery (%s): cannot register %s: %s", provider, wanted.url, outcome)
                failed += 1
                continue
            log.info("discovery (%s): registering %s (%s, %s)", provider, wanted.url, wanted.worker_type, discovery_id)
            registered += 1
    return PassResult(len(found), registered, failed, removed, deferred)


Publish = Callable[[Mapping[str, DiscoveredWorker]], None]


class DiscoveryProvider(Protocol):
    """Watches its source for ever, calling ``publish`` with the whole set it sees each time that set
    may have changed (never before it has seen the whole source once)."""

    name: str

    async def run(self, publish: Publish) -> None: ...


class DiscoveryRunner:
    """Runs a provider in the process that leads the host and reconciles the store with what it
    publishes: at once (a burst shares one pass), and every RESYNC_SECS."""

    def __init__(self, provider: DiscoveryProvider, leading: Callable[[], bool]) -> None:
        self.provider = provider
        self._leading = leading
        self._found: Mapping[str, DiscoveredWorker] | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes = 0  # reconcile passes run (tests wait on them)
        self.last: PassResult | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def astop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def found(self) -> Mapping[str, DiscoveredWorker] | None:
        """What the provider last published (None: nothing yet)."""
        return self._found

    async def reconcile_now(self) -> PassResult | None:
        """One pass on what the provider last published, now (None: nothing published yet)."""
        if self._found is None:
            return None
        await self._pass(self._found)
        return self.last

    def publish(self, found: Mapping[str, DiscoveredWorker]) -> None:
        self._found = dict(found)
        self._changed.set()

    async def _run(self) -> None:
        while not self._leading():
            await asyncio.sleep(LEADER_POLL_SECS)
        log.info("worker discovery (%s) runs in this process", self.provider.name)
        watching = asyncio.ensure_future(self.provider.run(self.publish))
        try:
            await self._reconcile_loop(watching)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    async def _reconcile_loop(self, watching: asyncio.Task[None]) -> None:
        wait_secs = RESYNC_SECS
        while not watching.done():
            try:
                await asyncio.wait_for(self._changed.wait(), wait_secs)
                await asyncio.sleep(DEBOUNCE_SECS)
            except TimeoutError:
                pass
            self._changed.clear()
            found = self._found
            if found is None:  # the provider has not seen its whole source yet
                wait_secs = RESYNC_SECS
                continue
            wait_secs = await self._pass(found)
        if not watching.cancelled() and watching.exception() is not None:  # a provider only ends by a bug
            log.error("discovery (%s) stopped", self.provider.name, exc_info=watching.exception())

    async def _pass(self, found: Mapping[str, DiscoveredWorker]) -> float:
        started = time.perf_counter()
        try:
            result = await arun_db(reconcile, self.provider.name, found)
        except STORE_ERRORS:  # the store is down (logged once as an outage): again when it is back
            return STORE.retry_secs
        except Exception:
            log.exception("discovery (%s): reconcile pass failed", self.provider.name)
            return RESYNC_SECS
        self.passes += 1
        self.last = result
        telemetry.record_discovery_pass(
            self.provider.name, result.discovered, result.registered, result.failed, result.removed,
            time.perf_counter() - started,
        )
        return DEFERRED_RETRY_SECS if result.deferred else RESYNC_SECS

