"""The runtime and allocator metrics of the catalog (spec 3) besides the event-loop canary
(:func:`common.telemetry.run_sampler`), in the gateway's metrics registry: what the reference
exports of its Tokio runtime, given for the asyncio (uvloop) event loop that serves this process's
requests. Sampled by the 1 s gauge sampler, in the loop's thread, never per request.

- ``gw_runtime_workers``: event-loop threads serving requests in this process: 1 (one loop per
  process; ``--workers N`` runs N processes, and the export sums them: N).
- ``gw_runtime_worker_busy_ratio{worker}``: the fraction of wall time of the last sampling interval
  the loop's thread was on a CPU (its own CPU time, user and system, from
  ``getrusage(RUSAGE_THREAD)``), 0 to 1: the time it ran callbacks, where Tokio counts a worker's
  time not parked. The loop's wait for I/O (``epoll_wait``) costs no CPU time; time spent waiting
  for the GIL another thread holds is not counted as busy either.
- ``gw_runtime_worker_parks_total{worker}``: the times the loop's thread went to sleep, its
  voluntary context switches (``ru_nvcsw`` of the same call): nearly all are the loop's waits for
  I/O or a timer in ``epoll_wait``; a wait for the GIL or a lock counts too.
- ``gw_runtime_global_queue_depth``: work ready to run, queued on the loop, at the sample: the loop's
  ready-callback queue where the loop shows it (asyncio's own loop), else (uvloop keeps it in C) the
  tasks ready to take a step (not done, and not waiting on a future still pending).

``worker`` is this process's place among the serving processes (``GW_SERVING_INDEX``, 0 alone), as
Tokio numbers its workers: one series per process in multiprocess mode, where the gauges are
``livesum`` (a stopped process's are dropped) and the ratio ``livemax`` of one process's own series.

- ``gw_allocator_*_bytes``, refreshed every 60 s, of the C allocator (glibc's ``malloc``, which
  CPython's object allocator draws its arenas from), through ``mallinfo2``:
  ``allocated`` = bytes in chunks handed out (``uordblks`` + ``hblkhd``, the mmapped ones);
  ``active`` = bytes the allocator holds from the system (``arena`` + ``hblkhd``: in use, plus free
  chunks kept for reuse); ``resident`` = the process's resident set (``/proc/self/statm``, pages in
  RAM, whatever allocated them); ``metadata`` = NaN: glibc gives no figure for its own bookkeeping
  (its chunk headers are inside ``allocated``). Without ``mallinfo2`` (not glibc, or glibc < 2.33)
  the three allocator figures are NaN and only ``resident`` is given.
- ``gw_http_inflight_request_age_count{gt, le}``: the data-plane HTTP requests in flight by age,
  non-cumulative buckets ``gt < age <= le`` (bounds 30 s .. 86,400 s, then ``+Inf``), computed at the
  sample from the start times of the requests :class:`common.telemetry.HttpTimer` holds in its
  in-flight set (a request's only cost: its timer added to and removed from a set).
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import resource
import weakref
from bisect import bisect_left
from time import monotonic, perf_counter
from typing import Any, Iterable

from prometheus_client import Counter, Gauge

from common.serving import serving_place
from common.telemetry import INFLIGHT, REGISTRY

__all__ = [
    "RUNTIME_GLOBAL_QUEUE_DEPTH",
    "RUNTIME_WORKERS",
    "RUNTIME_WORKER_BUSY_RATIO",
    "RUNTIME_WORKER_PARKS",
    "ALLOCATOR_ALLOCATED",
    "ALLOCATOR_ACTIVE",
    "ALLOCATOR_RESIDENT",
    "ALLOCATOR_METADATA",
    "INFLIGHT_AGE",
    "INFLIGHT_AGE_BOUNDS",
    "RuntimeSampler",
    "ready_depth",
    "allocator_figures",
    "age_buckets",
    "sample_inflight_ages",
]

RUNTIME_GLOBAL_QUEUE_DEPTH = Gauge("gw_runtime_global_queue_depth", "Work ready to run queued on the event loop",
                                   multiprocess_mode="livesum", registry=REGISTRY)  # fmt: skip
RUNTIME_WORKERS = Gauge("gw_runtime_workers", "Event-loop threads serving requests",
                        multiprocess_mode="livesum", registry=REGISTRY)  # fmt: skip
RUNTIME_WORKER_BUSY_RATIO = Gauge(
    "gw_runtime_worker_busy_ratio", "Fraction of the last sampling interval the event loop's thread ran (0-1)",
    ("worker",), multiprocess_mode="livemax", registry=REGISTRY,
)
RUNTIME_WORKER_PARKS = Counter("gw_runtime_worker_parks_total", "Times the event loop's thread went to sleep",
                               ("worker",), registry=REGISTRY)  # fmt: skip

ALLOCATOR_ALLOCATED = Gauge("gw_allocator_allocated_bytes", "Bytes in chunks the C allocator handed out",
                            multiprocess_mode="livesum", registry=REGISTRY)  # fmt: skip
ALLOCATOR_ACTIVE = Gauge("gw_allocator_active_bytes", "Bytes the C allocator holds from the system",
                         multiprocess_mode="livesum", registry=REGISTRY)  # fmt: skip
ALLOCATOR_RESIDENT = Gauge("gw_allocator_resident_bytes", "Resident set of the process",
                           multiprocess_mode="livesum", registry=REGISTRY)  # fmt: skip
ALLOCATOR_METADATA = Gauge("gw_allocator_metadata_bytes", "C allocator bookkeeping bytes (NaN: glibc gives none)",
                           multiprocess_mode="livesum", registry=REGISTRY)  # fmt: skip

INFLIGHT_AGE_BOUNDS = (30, 60, 180, 300, 600, 1200, 3600, 7200, 14400, 28800, 86400)
INFLIGHT_AGE = Gauge(
    "gw_http_inflight_request_age_count", "HTTP requests in flight by age, non-cumulative buckets gt < age <= le",
    ("gt", "le"), multiprocess_mode="livesum", registry=REGISTRY,
)
_AGE_LABELS = tuple(zip(("0", *map(str, INFLIGHT_AGE_BOUNDS)), (*map(str, INFLIGHT_AGE_BOUNDS), "+Inf")))
_AGE_CHILDREN = tuple(INFLIGHT_AGE.labels(gt, le) for gt, le in _AGE_LABELS)

ALLOCATOR_INTERVAL_SECS = 60.0


# --- runtime -------------------------------------------------------------------------------------
# asyncio's registry of tasks (a WeakSet; its ``data`` the set of weak references): read directly,
# ``asyncio.all_tasks`` costs a Python call per task (~3k instructions a task a sample, D100).
_ALL_TASKS: Any = getattr(getattr(asyncio.tasks, "_all_tasks", None), "data", None)


def ready_depth(loop: asyncio.AbstractEventLoop) -> int:
    """Work ready to run on ``loop`` now: its ready-callback queue when it has one in Python
    (asyncio's loop), else the tasks ready to take a step: not done, and not waiting on a future
    still pending (uvloop's queue is in C)."""
    ready = getattr(loop, "_ready", None)
    if ready is not None:
        return len(ready)
    if _ALL_TASKS is None:
        tasks: Iterable[Any] = asyncio.all_tasks(loop)
    else:
        tasks = map(_deref, tuple(_ALL_TASKS))
    depth = 0
    for task in tasks:
        if task is not None and task.get_loop() is loop:
            waiter = task._fut_waiter
            if (waiter is None or waiter.done()) and not task.done():
                depth += 1
    return depth


_deref = weakref.ref.__call__  # a weak reference's referent, or None (C: no Python frame a task)


class RuntimeSampler:
    """The loop thread's CPU time and sleeps between two samples. Call :meth:`sample` from the
    loop's own thread (``RUSAGE_THREAD`` is the calling thread's)."""

    def __init__(self) -> None:
        place = serving_place()
        self.worker = str(place.index if place is not None else 0)
        self._busy = RUNTIME_WORKER_BUSY_RATIO.labels(self.worker)
        self._parks = RUNTIME_WORKER_PARKS.labels(self.worker)
        self._wall = perf_counter()
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        self._cpu = usage.ru_utime + usage.ru_stime
        self._sleeps = usage.ru_nvcsw
        RUNTIME_WORKERS.set(1)

    def sample(self, loop: asyncio.AbstractEventLoop | None = None) -> tuple[float, int]:
        """Set the runtime gauges; the busy ratio and parks of the interval since the last call."""
        wall = perf_counter()
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        cpu = usage.ru_utime + usage.ru_stime
        elapsed = wall - self._wall
        ratio = min(1.0, max(0.0, (cpu - self._cpu) / elapsed)) if elapsed > 0 else 0.0
        parks = max(0, usage.ru_nvcsw - self._sleeps)
        self._wall, self._cpu, self._sleeps = wall, cpu, usage.ru_nvcsw
        self._busy.set(ratio)
        if parks:
            self._parks.inc(parks)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called off a loop (a test's direct call): no queue to read
                return ratio, parks
        RUNTIME_GLOBAL_QUEUE_DEPTH.set(ready_depth(loop))
        return ratio, parks


# --- allocator -----------------------------------------------------------------------------------
class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
    )]  # fmt: skip


def _mallinfo2() -> Any:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


_MALLINFO2 = _mallinfo2()
_PAGE = os.sysconf("SC_PAGE_SIZE")


def allocator_figures() -> tuple[float, float, float, float]:
    """(allocated, active, resident, metadata) bytes, as the module docstring maps them; NaN where unknown."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident = float(int(statm.read().split()[1]) * _PAGE)
    except (OSError, IndexError, ValueError):
        resident = math.nan
    if _MALLINFO2 is None:
        return math.nan, math.nan, resident, math.nan
    info = _MALLINFO2()
    return float(info.uordblks + info.hblkhd), float(info.arena + info.hblkhd), resident, math.nan


def sample_allocator() -> None:
    allocated, active, resident, metadata = allocator_figures()
    ALLOCATOR_ALLOCATED.set(allocated)
    ALLOCATOR_ACTIVE.set(active)
    ALLOCATOR_RESIDENT.set(resident)
    ALLOCATOR_METADATA.set(metadata)


# --- in-flight request ages ----------------------------------------------------------------------
def age_buckets(ages: Iterable[float]) -> list[int]:
    """How many of ``ages`` fall in each bucket ``gt < age <= le`` (the last one past 86,400 s)."""
    counts = [0] * (len(INFLIGHT_AGE_BOUNDS) + 1)
    for age in ages:
        counts[bisect_left(INFLIGHT_AGE_BOUNDS, age)] += 1
    return counts


_age_counts = [-1] * len(_AGE_CHILDREN)  # what each bucket's gauge was last set to


def sample_inflight_ages(now: float | None = None) -> list[int]:
    """Set the age gauge from the in-flight requests' start times (``perf_counter`` marks); only the
    buckets that changed are written (a gauge's set takes a lock)."""
    now = perf_counter() if now is None else now
    counts = age_buckets([now - timer.started for timer in tuple(INFLIGHT)])
    for at, count in enumerate(counts):
        if _age_counts[at] != count:
            _age_counts[at] = count
            _AGE_CHILDREN[at].set(count)
    return counts


# --- the sampler's hook --------------------------------------------------------------------------
class _Samples:
    def __init__(self) -> None:
        self.runtime: RuntimeSampler | None = None
        self.allocator_due = 0.0


_SAMPLES = _Samples()


def sample_runtime() -> None:
    """The runtime gauges and in-flight ages (every call: the 1 s sampler), the allocator's figures
    every 60 s. From the event loop's thread."""
    samples = _SAMPLES
    if samples.runtime is None:
        samples.runtime = RuntimeSampler()
    else:
        samples.runtime.sample()
    sample_inflight_ages()
    now = monotonic()
    if now >= samples.allocator_due:
        samples.allocator_due = now + ALLOCATOR_INTERVAL_SECS
        sample_allocator()
