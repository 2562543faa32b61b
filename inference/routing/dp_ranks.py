"""Data-parallel aware routing (--dp-aware): which rank of a worker's engine a request goes to.

Under --dp-aware a worker whose engine reported a dp_size above 1 at registration has
``WorkerRecord.dp_ranks`` set; every attempt on it takes one rank (:func:`take_rank`), sent to the
engine with the request (HTTP: the JSON body's ``data_parallel_rank``; engines the gateway serves:
``EngineRequest.data_parallel_rank``), and gives it back when the attempt ends (:func:`give_back`).
Prefill and decode workers of a PD pair each take a rank of their own.

The rank is the least loaded one: the load monitor's last report for the rank (running plus waiting
requests) plus the requests this process has in flight on it (the report is up to one poll old);
ties go round robin. Without a report the in-flight counts alone decide. In memory only: nothing on
the request path reads the store.
"""

from __future__ import annotations

from inference.routing.workers import WorkerHandle, WorkerLoad

__all__ = ["take_rank", "give_back", "choose_rank"]


def _reported(load: WorkerLoad, size: int) -> list[int]:
    """Running plus waiting requests per rank, as the load monitor last read them (0 unreported)."""
    queued = [0] * size
    for entry in load.engine_load or ():
        rank = entry.get("dp_rank")
        if isinstance(rank, int) and 0 <= rank < size:
            queued[rank] = int(entry.get("num_running_reqs") or 0) + int(entry.get("num_waiting_reqs") or 0)
    return queued


def choose_rank(load: WorkerLoad, size: int) -> int:
    """The least loaded of ``size`` ranks (see the module's docstring), counted as taken."""
    counts = load.rank_in_flight
    if len(counts) != size:  # the first request, or the engine's dp_size changed
        counts[:] = (counts + [0] * size)[:size]
    start = load.rank_turn % size
    load.rank_turn = start + 1
    queued = _reported(load, size) if load.engine_load else None
    if queued is None:
        rank = min(range(size), key=lambda r: (counts[r], (r - start) % size))
    else:
        rank = min(range(size), key=lambda r: (queued[r] + counts[r], (r - start) % size))
    counts[rank] += 1
    return rank


def take_rank(handle: WorkerHandle) -> WorkerHandle:
    """``handle`` for one attempt: with a rank taken when its worker has data-parallel ranks to
    choose among, else ``handle`` itself."""
    size = handle.record.dp_ranks
    if size < 2:
        return handle
    return WorkerHandle(handle.record, handle.load, choose_rank(handle.load, size))


def give_back(handle: WorkerHandle) -> None:
    """End the attempt ``handle`` (from :func:`take_rank`) took a rank for; nothing without one."""
    rank = handle.dp_rank
    if rank is None:
        return
    counts = handle.load.rank_in_flight
    if rank < len(counts) and counts[rank] > 0:
        counts[rank] -= 1
