"""The engines of a ZMQ worker: one :class:`EngineRank` per data-parallel index, with where its
handshake stands, what its ready response said, and its last scheduler stats (its load)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgspec

from inference.routing.load_report import EngineLoad
from inference.upstreams.zmq import codec

__all__ = ["EngineRank", "RankState"]


class RankState(Enum):
    NEW = "new"  # no HELLO yet
    CONNECTED = "connected"  # INIT sent
    STARTED = "started"  # READY received
    READY = "ready"  # READY and the ready response on the input socket: serving
    DEAD = "dead"


@dataclass
class EngineRank:
    """One data-parallel engine of the worker, as the handshake and its outputs left it."""

    index: int
    state: RankState = RankState.NEW
    registered: bool = False  # the ready response arrived on the input socket
    num_gpu_blocks: int = 0
    ready_response: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)  # the last SchedulerStats, when given decoded
    raw_stats: msgspec.Raw | None = None  # the last SchedulerStats as the engine sent it (decoded by load)
    stats_at: float = 0.0  # when they came (wall clock; kept by one of several serving processes' clients)
    in_flight: int = 0

    @property
    def identity(self) -> bytes:
        return codec.engine_identity(self.index)

    def latest_stats(self) -> dict[str, Any]:
        return codec.decode_stats(self.raw_stats) if self.raw_stats is not None else self.stats

    def load(self, stats: dict[str, Any] | None = None) -> EngineLoad:
        """This rank's load from its last scheduler stats (or ``stats``, fresher ones another
        serving process received) and its ready response."""
        if stats is None:
            stats = self.latest_stats()
        running = int(stats.get("num_running_reqs") or 0)
        waiting = int(stats.get("num_waiting_reqs") or 0)
        usage = float(stats.get("kv_cache_usage") or 0.0)
        prefix = stats.get("prefix_cache_stats") or {}
        queries = int(prefix.get("queries") or 0) if isinstance(prefix, dict) else 0
        hits = int(prefix.get("hits") or 0) if isinstance(prefix, dict) else 0
        block_size = int(self.ready_response.get("block_size") or 0)
        blocks = self.num_gpu_blocks or int(self.ready_response.get("num_gpu_blocks") or 0)
        capacity = blocks * block_size
        max_running = int(self.ready_response.get("max_num_seqs") or 0)
        return EngineLoad(
            dp_rank=self.index,
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            num_waiting_uncached_tokens=0,
            num_total_reqs=running + waiting,
            num_used_tokens=int(usage * capacity),
            max_total_num_tokens=capacity,
            token_usage=usage,
            gen_throughput=0.0,
            cache_hit_rate=hits / queries if queries else 0.0,
            utilization=running / max_running if max_running else 0.0,
            max_running_requests=max_running,
        )
