"""The load monitor (spec 3, Load report entry and the overload block).

Every --load-monitor-interval seconds it asks each ready self-hosted HTTP worker for its engine load:
SGLang's ``GET /get_load`` (one JSON object per data-parallel rank), or, where that route is missing
or fails, the engine's Prometheus ``GET /metrics`` gauges (vLLM's or SGLang's names). A ready gRPC
worker is asked by GetLoads through the process's shared engine client (``data_plane().engines``);
a runtime without GetLoads (TensorRT-LLM, MLX) has no report, said once in the log and asked again
only every :data:`NO_LOAD_ROUTE_RETRY_SECS`. Each answer
becomes the spec's load report entries, kept on the worker's live state in the registry
(``WorkerLoad.engine_load``) so /loads and the worker objects read a cached snapshot without calling
a worker. A worker whose report crosses its overload thresholds (waiting requests summed across dp
ranks, or mean KV token usage) is marked ``overloaded`` and leaves routing; it returns once a report
is below both. A failed poll drops the worker's report (it is left out of /loads) and keeps its
overload state until a report says otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from administration.worker_clients import WorkerClients, WorkerRequestFailed
from common.telemetry import record_engine_load
from common.ticks import sleep_to_mark
from inference.dataplane import data_plane
from inference.routing.load_report import EngineLoad, LoadEntry
from inference.routing.registry import REGISTRY, WorkerRegistry
from inference.routing.workers import WorkerRecord
from inference.upstreams.failures import FailureKind, UpstreamFailure

__all__ = [
    "LoadTarget",
    "LoadEntry",
    "LoadMonitor",
    "entries_from_engine_loads",
    "entries_from_get_load",
    "entries_from_metrics",
    "is_overloaded",
]

log = logging.getLogger(__name__)

_MAX_POLL_TIMEOUT_SECS = 5.0
NO_LOAD_ROUTE_RETRY_SECS = 60.0  # a worker without /get_load and /metrics (or GetLoads) is asked again after this


@dataclass(frozen=True, slots=True)
class LoadTarget:
    """One worker to poll, with its overload thresholds (None: that threshold is off). ``engine`` is
    the record of a gRPC worker, polled by GetLoads through its engine client (None: HTTP)."""

    worker_id: str
    url: str
    api_key: str | None
    worker_type: str
    runtime_type: str
    waiting_requests: int | None = None
    token_usage: float | None = None
    engine: WorkerRecord | None = None

    @property
    def protected(self) -> bool:
        return self.waiting_requests is not None or self.token_usage is not None


_OPTIONAL_FIELDS = (
    "memory",
    "queues",
    "kv_transfer_latency_ms",
    "kv_transfer_speed_gb_s",
    "prefill_queue_reqs",
    "decode_queue_reqs",
    "disagg_mode",
)


def _int(value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) else 0


def _float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _entry(
    target: LoadTarget,
    dp_rank: int,
    running: int,
    waiting: int,
    used_tokens: int,
    max_tokens: int,
    token_usage: float | None,
    raw: dict[str, Any],
) -> LoadEntry:
    usage = token_usage if token_usage is not None else (used_tokens / max_tokens if max_tokens else 0.0)
    max_running = _int(raw.get("max_running_requests"))
    utilization = raw.get("utilization")
    entry: LoadEntry = {
        "worker": target.url,
        "worker_type": target.worker_type,
        "dp_rank": dp_rank,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": _int(raw.get("num_waiting_uncached_tokens")),
        "num_total_reqs": running + waiting,
        "num_used_tokens": used_tokens,
        "max_total_num_tokens": max_tokens,
        "token_usage": min(1.0, max(0.0, usage)),
        "gen_throughput": _float(raw.get("gen_throughput")),
        "cache_hit_rate": _float(raw.get("cache_hit_rate")),
        "utilization": _float(utilization) if utilization is not None else (running / max_running if max_running else 0.0),
        "max_running_requests": max_running,
    }
    for key in _OPTIONAL_FIELDS:
        if raw.get(key) is not None:
            entry[key] = raw[key]  # type: ignore[literal-required]
    return entry


def entries_from_get_load(target: LoadTarget, payload: Any) -> list[LoadEntry]:
    """Entries from SGLang's /get_load: a list of per-rank objects (``num_reqs`` counts running and
    waiting requests, ``num_tokens`` the used tokens), an object with ``loads``, or one object."""
    if isinstance(payload, dict):
        payload = payload.get("loads", [payload])
    if not isinstance(payload, list):
        raise ValueError("load report is not a list of objects")
    entries = []
    for index, raw in enumerate(payload):
        if not isinstance(raw, dict):
            raise ValueError("load report is not a list of objects")
        waiting = _int(raw.get("num_waiting_reqs"))
        if "num_running_reqs" in raw:
            running = _int(raw["num_running_reqs"])
        else:
            running = max(0, _int(raw.get("num_reqs")) - waiting)
        used = _int(raw.get("num_used_tokens", raw.get("num_tokens")))
        usage = raw.get("token_usage")
        entries.append(
            _entry(
                target,
                _int(raw.get("dp_rank", index)),
                running,
                waiting,
                used,
                _int(raw.get("max_total_num_tokens")),
                None if usage is None else _float(usage),
                raw,
            )
        )
    return entries


def entries_from_engine_loads(target: LoadTarget, loads: Sequence[EngineLoad]) -> list[LoadEntry]:
    """Entries from a gRPC engine's GetLoads (one SchedulerLoad per data-parallel rank). proto3
    cannot tell an unreported token usage or utilization from 0.0: a zero is derived (from the used
    and total tokens, from the running requests), as for an HTTP report without it."""
    entries = []
    for load in loads:
        raw: dict[str, Any] = dict(load)
        if not raw.get("utilization"):
            raw["utilization"] = None
        entries.append(
            _entry(
                target,
                load["dp_rank"],
                load["num_running_reqs"],
                load["num_waiting_reqs"],
                load["num_used_tokens"],
                load["max_total_num_tokens"],
                load["token_usage"] or None,
                raw,
            )
        )
    return entries


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

# Prometheus gauge name -> load field, for the engines that have no /get_load.
_METRIC_FIELDS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "usage",
    "vllm:gpu_cache_usage_perc": "usage",
    "sglang:num_running_reqs": "running",
    "sglang:num_requests_running": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "usage",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:cache_hit_rate": "cache_hit_rate",
}


def entries_from_metrics(target: LoadTarget, text: str) -> list[LoadEntry]:
    """Entries from an engine's Prometheus gauges, one per ``dp_rank`` label value (rank 0 without
    one); samples of one rank are summed (several engines or models behind one server)."""
    ranks: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in _METRIC_FIELDS:
            continue
        labels = dict(_LABEL.findall(match.group(3) or ""))
        rank = ranks.setdefault(_int(labels.get("dp_rank", 0)), {})
        key = _METRIC_FIELDS[match.group(1)]
        rank[key] = rank.get(key, 0.0) + _float(match.group(4))
    if not ranks:
        raise ValueError("no load gauges in the metrics")
    return [
        _entry(
            target,
            rank,
            _int(values.get("running")),
            _int(values.get("waiting")),
            0,
            0,
            values.get("usage", 0.0),
            {"gen_throughput": values.get("gen_throughput"), "cache_hit_rate": values.get("cache_hit_rate")},
        )
        for rank, values in sorted(ranks.items())
    ]


def is_overloaded(target: LoadTarget, entries: Sequence[LoadEntry]) -> bool:
    """At or above a threshold: waiting requests summed across ranks, or mean token usage."""
    if not target.protected or not entries:
        return False
    waiting = sum(entry["num_waiting_reqs"] for entry in entries)
    usage = sum(entry["token_usage"] for entry in entries) / len(entries)
    if target.waiting_requests is not None and waiting >= target.waiting_requests:
        return True
    return target.token_usage is not None and usage >= target.token_usage


class LoadMonitor:
    """Polls the targets every ``interval`` seconds (all of them in parallel) and publishes each
    worker's report on its live state in ``registry``."""

    def __init__(self, interval: float, registry: WorkerRegistry = REGISTRY) -> None:
        self.interval = interval
        self.registry = registry
        self._targets: dict[str, LoadTarget] = {}
        self._task: asyncio.Task[None] | None = None
        self._clients = WorkerClients()
        self._route: dict[str, str] = {}  # worker id -> the load route that answered last
        self._quiet_until: dict[str, float] = {}  # worker id -> monotonic time to ask again
        self._unreported: set[str] = set()  # gRPC workers whose runtime has no GetLoads (logged once)
        # Called after each poll round (the leader of a supervised gateway shares its reports).
        self.after_poll: Callable[[], Awaitable[None]] | None = None

    @property
    def targets(self) -> tuple[LoadTarget, ...]:
        return tuple(self._targets.values())

    def reconcile(self, targets: Sequence[LoadTarget]) -> None:
        """Poll exactly these workers from now on (after a full reload of the fleet)."""
        wanted = {target.worker_id: target for target in targets}
        for worker_id in self._targets.keys() - wanted.keys():
            self.update(worker_id, None)
        for worker_id, target in wanted.items():
            self.update(worker_id, target)

    def update(self, worker_id: str, target: LoadTarget | None) -> None:
        """Poll one worker by this target from now on; None: not any more, and it is back to no report."""
        if target is None:
            gone = self._targets.pop(worker_id, None)
            if gone is None:
                return
            self._route.pop(worker_id, None)
            self._quiet_until.pop(worker_id, None)
            self._unreported.discard(worker_id)
            record_engine_load(gone.url, None, None)
            load = self.registry.load_of(worker_id)
            if load is not None:
                load.engine_load, load.overloaded = None, False
            return
        load = self.registry.load_of(worker_id)
        if load is not None and not target.protected:
            load.overloaded = False
        self._targets[worker_id] = target

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._clients.aclose()

    async def apoll(self) -> None:
        """One round: every target polled in parallel, reports and overload states updated. Workers
        left alone for now (no load route) cost nothing: their report stays empty."""
        now = time.monotonic()
        quiet = self._quiet_until
        targets = [target for target in self._targets.values() if quiet.get(target.worker_id, 0.0) <= now]
        reports = await asyncio.gather(*(self._afetch(target) for target in targets))
        models = {handle.id: handle.record.model_id for handle in self.registry.snapshot.workers}
        for target, entries in zip(targets, reports):
            if self._targets.get(target.worker_id) is not target:
                continue  # reconciled away while polling
            load = self.registry.load_of(target.worker_id)
            if load is None:
                continue
            load.engine_load = None if entries is None else tuple(dict(entry) for entry in entries)
            record_engine_load(target.url, models.get(target.worker_id), load.engine_load)
            if entries is not None:
                overloaded = is_overloaded(target, entries)
                if overloaded != load.overloaded:
                    log.warning(
                        "worker %s %s routing (overload protection)", target.url, "leaves" if overloaded else "returns to"
                    )
                load.overloaded = overloaded
        self.registry.loads_polled_at = time.time()
        if self.after_poll is not None:
            await self.after_poll()

    async def _run(self) -> None:
        while True:
            try:
                await self.apoll()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("load poll failed")
            await sleep_to_mark(self.interval)

    async def _afetch(self, target: LoadTarget) -> list[LoadEntry] | None:
        """The worker's load report: from the route that answered last time, else /get_load (not on
        vLLM) then /metrics. A worker that has neither (404 on both) is left alone for
        :data:`NO_LOAD_ROUTE_RETRY_SECS`: a fleet of plain OpenAI servers costs no polls."""
        worker_id = target.worker_id
        if self._quiet_until.get(worker_id, 0.0) > time.monotonic():
            return None
        if target.engine is not None:
            return await self._afetch_engine(target, target.engine)
        routes: tuple[str, ...] = ("/metrics",) if target.runtime_type == "vllm" else ("/get_load", "/metrics")
        known = self._route.get(worker_id)
        if known is not None:
            routes = (known, *(route for route in routes if route != known))
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        timeout = min(self.interval, _MAX_POLL_TIMEOUT_SECS)
        missing = 0
        for route in routes:
            try:
                answer = await self._clients.get(target.url + route, headers, timeout)
                if answer.ok:
                    entries = (
                        entries_from_get_load(target, answer.json()) if route == "/get_load"
                        else entries_from_metrics(target, answer.text)
                    )
                    self._route[worker_id] = route
                    return entries
                missing += answer.status == 404
            except (WorkerRequestFailed, ValueError) as exc:
                log.debug("%s of %s failed: %s", route, target.url, exc)
        self._route.pop(worker_id, None)
        if missing == len(routes):
            self._quiet_until[worker_id] = time.monotonic() + NO_LOAD_ROUTE_RETRY_SECS
        return None

    async def _afetch_engine(self, target: LoadTarget, record: WorkerRecord) -> list[LoadEntry] | None:
        """A gRPC worker's GetLoads through its shared engine client, in turn with the HTTP polls. An
        engine that answers without loads (no GetLoads in its runtime, or the RPC failing inside it)
        is logged once and left alone for :data:`NO_LOAD_ROUTE_RETRY_SECS`; one that cannot be
        reached is asked again next round."""
        worker_id = target.worker_id
        try:
            async with self._clients.turn():
                async with asyncio.timeout(min(self.interval, _MAX_POLL_TIMEOUT_SECS)):
                    loads = await data_plane().engines.client(record).loads()
        except TimeoutError:
            log.debug("GetLoads of %s timed out", target.url)
            return None
        except UpstreamFailure as exc:
            if exc.kind is not FailureKind.BROKEN:
                log.debug("GetLoads of %s failed: %s", target.url, exc)
                return None
            if worker_id not in self._unreported:
                self._unreported.add(worker_id)
                log.info("worker %s reports no load (asked again every %g s): %s", target.url,
                         NO_LOAD_ROUTE_RETRY_SECS, exc)
            self._quiet_until[worker_id] = time.monotonic() + NO_LOAD_ROUTE_RETRY_SECS
            return None
        self._unreported.discard(worker_id)
        return entries_from_engine_loads(target, loads)
