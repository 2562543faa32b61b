"""Health checks (spec 3, Worker status): pending → ready → not_ready → ready.

One asyncio task per checked worker probes it: an HTTP worker by ``GET {url}{endpoint}``, a gRPC
worker by its engine's HealthCheck RPC through the process's shared engine client
(``data_plane().engines``: the one channel the data plane uses too); an answer of healthy=false or
a failed RPC is a failed probe. ``success_threshold``
consecutive successes make a pending or not_ready worker ready; ``failure_threshold`` consecutive
failures make a ready worker not_ready. A pending worker is probed every second until it is ready,
then every ``check_interval_secs``. Transitions are conditional UPDATEs, so several gateway
processes probing the same worker agree. A gRPC prefill or decode worker that recovers (not_ready
to ready) has its kv_engine_id asked of its engine again (:mod:`administration.kv_engine_reread`).

The cost stays flat as the fleet grows: each worker keeps a connection between probes and a bounded
number of probes run at once, their timeouts starting when they get their turn
(:mod:`administration.worker_clients`); schedules are jittered, so a thousand workers registered
together are not probed in one burst, and sleep to the marks of a shared grid (common/ticks.py), so
the probes due about the same time wake the process once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, replace
from typing import Awaitable, Callable, Sequence

from django.db import transaction

from common.db import STORE_ERRORS, arun_db
from administration.kv_engine_reread import reread_kv_engine_id, rereads_kv_engine_id
from administration.worker_clients import WorkerClients, WorkerRequestFailed
from common.telemetry import record_health_check
from common.ticks import sleep_to_mark
from administration.models import Worker, WorkerStatus, WorkerType
from administration.reachability import Reachability
from administration.notices import publish_registry_changed, publish_registry_changes
from inference.dataplane import data_plane
from inference.routing.workers import WorkerRecord
from inference.upstreams.failures import UpstreamFailure

__all__ = ["HealthTarget", "HealthChecker", "transition", "transitions"]

log = logging.getLogger(__name__)

_PENDING_PROBE_SECS = 1.0
# The first probes of loops started together (a fleet at start) are spread to about this many a
# second; a loop started alone (a worker just registered) probes at once.
_FIRST_PROBES_PER_SEC = 1000.0


@dataclass(frozen=True, slots=True)
class HealthTarget:
    """One worker to check. ``engine`` is the record of a gRPC worker, probed by HealthCheck through
    its engine client (None: an HTTP worker, probed at ``endpoint``)."""

    worker_id: str
    url: str
    api_key: str | None
    status: str
    endpoint: str
    timeout_secs: float
    interval_secs: float
    success_threshold: int
    failure_threshold: int
    worker_type: str = WorkerType.REGULAR  # the gw_worker_health_checks_total label
    engine: WorkerRecord | None = None


def transition(worker_id: str, old: str, new: str) -> bool:
    """Move a worker from ``old`` to ``new``; False when its status was no longer ``old``. A move is
    published as a registry change (its notice names the worker), so every gateway process routes by
    it at once, or within about a second from the change log."""
    moved = Worker.objects.filter(pk=worker_id, status=old, registered=True).update(status=new) == 1
    if moved:
        publish_registry_changed(worker_id)
    return moved


def transitions(moves: Sequence[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
    """:func:`transition` for many workers at once (probes that passed together while a fleet
    registers), each move ``(worker_id, old, new)``: one transaction, a read and a write per kind of
    move, and their changes published together. The moves that happened."""
    if len(moves) == 1:
        return set(moves) if transition(*moves[0]) else set()
    by_move: dict[tuple[str, str], list[str]] = {}
    for worker_id, old, new in moves:
        by_move.setdefault((old, new), []).append(worker_id)
    done: set[tuple[str, str, str]] = set()
    moved: list[str] = []
    with transaction.atomic():
        for (old, new), worker_ids in by_move.items():
            found = [
                str(pk) for pk in Worker.objects.select_for_update()
                .filter(pk__in=worker_ids, status=old, registered=True).values_list("pk", flat=True)
            ]  # fmt: skip
            if found:
                Worker.objects.filter(pk__in=found).update(status=new)
                moved.extend(found)
                done.update((worker_id, old, new) for worker_id in found)
    publish_registry_changes(moved)
    return done


class _Transitions:
    """The transitions the probe loops ask for, written together: those asked while one write runs
    go in the next (no waiting added when they come one at a time)."""

    def __init__(self) -> None:
        self._asked: list[tuple[str, str, str, asyncio.Future[bool]]] = []
        self._writing: asyncio.Task[None] | None = None

    async def move(self, worker_id: str, old: str, new: str) -> bool:
        """Whether the store moved this worker from ``old`` to ``new``; raises what the write raised."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._asked.append((worker_id, old, new, answer))
        if self._writing is None or self._writing.done():
            self._writing = asyncio.ensure_future(self._write())
        return await answer

    async def _write(self) -> None:
        while self._asked:
            asked, self._asked = self._asked, []
            try:
                moved = await arun_db(transitions, [(worker_id, old, new) for worker_id, old, new, _ in asked])
            except Exception as exc:
                for *_, answer in asked:
                    if not answer.done():
                        answer.set_exception(exc)
                continue
            for worker_id, old, new, answer in asked:
                if not answer.done():
                    answer.set_result((worker_id, old, new) in moved)


class HealthChecker:
    def __init__(self, on_change: Callable[[str, WorkerStatus], Awaitable[object]]) -> None:
        """``on_change(worker_id, new_status)`` runs after each transition this checker made."""
        self._on_change = on_change
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._targets: dict[str, HealthTarget] = {}
        self._clients = WorkerClients()
        self._transitions = _Transitions()
        self._next_first = 0.0  # the event loop's time of the next free slot for a first probe

    def _first_delay(self, window: float) -> float:
        """How long a loop started now waits before its first probe: the next free slot of a grid of
        _FIRST_PROBES_PER_SEC, so loops started together (a thousand registered at once) are not
        probed in one burst and one started alone is probed at once; past ``window`` (more started
        at once than the grid spreads over it), a random point of the window, as for every loop before."""
        now = asyncio.get_running_loop().time()
        slot = max(now, self._next_first) + 1.0 / _FIRST_PROBES_PER_SEC
        if slot - now > window:
            return random.uniform(0.0, window)
        self._next_first = slot
        return slot - now

    def reconcile(self, targets: list[HealthTarget]) -> None:
        """Probe exactly these workers from now on (after a full reload of the fleet)."""
        wanted = {target.worker_id: target for target in targets}
        for worker_id in [worker_id for worker_id in self._tasks if worker_id not in wanted]:
            self.update(worker_id, None)
        for worker_id, target in wanted.items():
            self.update(worker_id, target)

    def update(self, worker_id: str, target: HealthTarget | None) -> None:
        """Probe one worker by this target from now on (None: stop probing it)."""
        if target is None:
            task = self._tasks.pop(worker_id, None)
            if task is not None:
                task.cancel()
            self._targets.pop(worker_id, None)
            return
        current = self._targets.get(worker_id)
        self._targets[worker_id] = target
        same = current is not None and (current.url, current.interval_secs, current.endpoint) == (
            target.url, target.interval_secs, target.endpoint
        )
        task = self._tasks.get(worker_id)
        if task is None or task.done() or not same:
            if task is not None:
                task.cancel()
            self._tasks[worker_id] = asyncio.ensure_future(self._probe_loop(worker_id))

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        await self._clients.aclose()

    async def probe(self, target: HealthTarget) -> str | None:
        """One probe: None when the worker answers healthy, else why not (the connection error,
        the HTTP status, or the gRPC status or health message)."""
        if target.engine is not None:
            return await self._probe_engine(target, target.engine)
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        try:
            answer = await self._clients.get(target.url + target.endpoint, headers, target.timeout_secs)
        except WorkerRequestFailed as exc:
            return str(exc)
        return None if answer.ok else f"HTTP {answer.status} for {target.url}{target.endpoint}"

    async def _probe_engine(self, target: HealthTarget, record: WorkerRecord) -> str | None:
        """HealthCheck through the worker's shared engine client, in turn with the HTTP probes; the
        timeout starts with its turn."""
        async with self._clients.turn():
            try:
                async with asyncio.timeout(target.timeout_secs):
                    health = await data_plane().engines.client(record).health()
            except UpstreamFailure as exc:
                return str(exc)
            except TimeoutError:
                return f"HealthCheck: no answer within {target.timeout_secs:g} s"
        return None if health.healthy else f"HealthCheck: unhealthy ({health.message})"

    async def _stored(self, worker_id: str, status: str, new: WorkerStatus) -> bool:
        """Record a transition in the store; False when it did not happen there. While the store is
        down (logged once as an outage) the worker keeps its status and the next probe tries again."""
        try:
            return await self._transitions.move(worker_id, status, new)
        except STORE_ERRORS:
            return False

    async def _probe_loop(self, worker_id: str) -> None:
        successes = failures = 0
        target = self._targets.get(worker_id)
        if target is None:
            return
        reachability = Reachability(target.url, "health check")  # why it fails, logged once per change
        await sleep_to_mark(self._first_delay(min(_PENDING_PROBE_SECS, target.interval_secs)))  # no burst
        while True:
            target = self._targets.get(worker_id)
            if target is None:
                return
            failure = await self.probe(target)
            healthy = failure is None
            if failure is None:
                reachability.answered()
            else:
                reachability.failed(failure)
            record_health_check(target.worker_type, healthy)
            successes, failures = (successes + 1, 0) if healthy else (0, failures + 1)
            status = self._targets[worker_id].status if worker_id in self._targets else target.status
            new = None
            if status in (WorkerStatus.PENDING, WorkerStatus.NOT_READY) and successes >= target.success_threshold:
                new = WorkerStatus.READY
            elif status == WorkerStatus.READY and failures >= target.failure_threshold:
                new = WorkerStatus.NOT_READY
            if new is not None and await self._stored(worker_id, status, new):
                level = logging.WARNING if new == WorkerStatus.NOT_READY else logging.INFO
                log.log(level, "worker %s: %s -> %s", target.url, status, new)
                self._targets[worker_id] = replace(target, status=new)
                successes = failures = 0
                await self._on_change(worker_id, new)
                if target.engine is not None and rereads_kv_engine_id(target.engine, target.worker_type, status, new):
                    await reread_kv_engine_id(worker_id, target.engine, target.timeout_secs)
            pause = target.interval_secs if status == WorkerStatus.READY or new == WorkerStatus.READY else _PENDING_PROBE_SECS
            await sleep_to_mark(min(pause, target.interval_secs) * random.uniform(0.9, 1.1))
