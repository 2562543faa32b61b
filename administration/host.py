"""What the serving processes of one supervised gateway (``rungateway --workers N``) share on their
host: a run directory, one leader among them, and the leader's load reports.

The supervisor gives each serving process its place through the environment (``GW_RUN_DIR``,
``GW_SERVING_INDEX``, ``GW_SERVING_PROCESSES``). The host's control loops (health checks, command-line
worker registration, the load monitor) run in one process only, the leader: whichever holds an
exclusive ``flock`` on ``leader.lock`` in the run directory. The kernel releases the lock when its
holder dies, and the others try for it every second, so another process takes over within about a
second. Worker statuses reach every process through the store; the leader's load reports go through
``loads.json`` in the run directory (written whole and renamed into place), which the others read
when it changes.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

from common.serving import ServingPlace, serving_place
from common.ticks import sleep_to_mark
from inference.routing.registry import WorkerRegistry

__all__ = ["HostPeers", "host_peers", "Leadership", "write_load_reports", "read_load_reports"]

log = logging.getLogger(__name__)

ELECTION_RETRY_SECS = 1.0


@dataclass(frozen=True, slots=True)
class HostPeers(ServingPlace):
    """This process's place among the serving processes of one gateway (``common.serving``), and
    the files they share."""

    @property
    def lock_path(self) -> Path:
        return self.run_dir / "leader.lock"

    @property
    def loads_path(self) -> Path:
        return self.run_dir / "loads.json"



def host_peers() -> HostPeers | None:
    """This process's place when a supervisor started it, else None (a gateway of one process)."""
    place = serving_place()
    return None if place is None else HostPeers(place.run_dir, place.index, place.count)


class Leadership:
    """Tries for the host's leader lock every second; ``on_elected`` runs once it is held. The lock
    is held until :meth:`release` or the process's end."""

    def __init__(self, path: Path, on_elected: Callable[[], Awaitable[None]]) -> None:
        self.path = path
        self.leader = False
        self._on_elected = on_elected
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        os.ftruncate(self._fd, 0)
        os.write(self._fd, str(os.getpid()).encode())
        return True

    async def run(self) -> None:
        while not self.try_acquire():
            await sleep_to_mark(ELECTION_RETRY_SECS)
        self.leader = True
        log.info("process %d leads this host's health checks, registrations and load polls", os.getpid())
        await self._on_elected()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None
        self.leader = False


def write_load_reports(path: Path, registry: WorkerRegistry) -> None:
    """The leader's load reports, for the other processes (a whole file renamed into place)."""
    workers: dict[str, Any] = {}
    for handle in registry.snapshot.workers:
        load = handle.load
        if load.engine_load is not None or load.overloaded:
            workers[handle.id] = {"entries": load.engine_load, "overloaded": load.overloaded}
    payload = orjson.dumps({"polled_at": registry.loads_polled_at, "workers": workers})
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(payload)
    os.replace(partial, path)


def read_load_reports(path: Path, registry: WorkerRegistry, seen_mtime: float) -> float:
    """Apply the leader's reports when the file changed since ``seen_mtime``; returns its mtime."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return seen_mtime
    if mtime == seen_mtime:
        return seen_mtime
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return seen_mtime  # replaced as we read it: next time
    reports: dict[str, Any] = data.get("workers") or {}
    for handle in registry.snapshot.workers:
        report = reports.get(handle.id)
        entries = None if report is None or report.get("entries") is None else tuple(report["entries"])
        handle.load.engine_load = entries
        handle.load.overloaded = bool(report and report.get("overloaded"))
    registry.loads_polled_at = data.get("polled_at") or time.time()
    return mtime
