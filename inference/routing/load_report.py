"""The load report (spec 3, Cache and load): what GET /loads and the deprecated GET /get_loads
answer, built from the load monitor's reports on the registry's live worker state (no worker call)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, NotRequired, TypedDict

from inference.routing.registry import WorkerRegistry

__all__ = ["GATEWAY_VERSION", "EngineLoad", "LoadEntry", "LoadsAggregate", "LoadsReport", "loads_report"]

GATEWAY_VERSION = "0.1.0"


class _EngineLoadRequired(TypedDict):
    dp_rank: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_waiting_uncached_tokens: int
    num_total_reqs: int
    num_used_tokens: int
    max_total_num_tokens: int
    token_usage: float
    gen_throughput: float
    cache_hit_rate: float
    utilization: float
    max_running_requests: int


class EngineLoad(_EngineLoadRequired, total=False):
    """One data-parallel rank's load as an engine reports it (HTTP /get_load or metrics, gRPC
    GetLoads), with the engines' scheduler-load names. (Optional keys through ``total=False``:
    with postponed annotations Python 3.11 does not see ``NotRequired``.)"""

    memory: dict[str, Any]
    queues: dict[str, Any]
    kv_transfer_latency_ms: float
    kv_transfer_speed_gb_s: float
    prefill_queue_reqs: int
    decode_queue_reqs: int
    disagg_mode: str


class LoadEntry(EngineLoad):
    """One entry of the load report (spec 3, Load report entry): an engine's rank load plus the
    worker it came from, added by the gateway."""

    worker: str
    worker_type: str



class LoadsAggregate(TypedDict):
    total_running_reqs: int
    total_waiting_reqs: int
    total_reqs: int
    avg_token_usage: float
    avg_throughput: float
    avg_utilization: float


class LoadsReport(TypedDict):
    timestamp: str
    version: str
    dp_rank_count: int
    loads: list[dict[str, Any]]
    aggregate: NotRequired[LoadsAggregate]


def loads_report(registry: WorkerRegistry, model: str | None = None) -> LoadsReport:
    """The spec's loads response from the reports on the registry's live worker state."""
    snapshot = registry.snapshot
    canonical = snapshot.canonical_model(model) if model else None
    entries: list[dict[str, Any]] = []
    for handle in snapshot.workers:
        if canonical is not None and handle.record.model_id != canonical:
            continue
        entries.extend(handle.load.engine_load or ())
    polled_at = registry.loads_polled_at or time.time()
    stamp = datetime.fromtimestamp(polled_at, timezone.utc).isoformat(timespec="milliseconds")
    report: LoadsReport = {
        "timestamp": stamp.replace("+00:00", "Z"),
        "version": f"gateway-{GATEWAY_VERSION}",
        "dp_rank_count": len(entries),
        "loads": entries,
    }
    if entries:
        count = len(entries)
        running = sum(int(e["num_running_reqs"]) for e in entries)
        waiting = sum(int(e["num_waiting_reqs"]) for e in entries)
        report["aggregate"] = {
            "total_running_reqs": running,
            "total_waiting_reqs": waiting,
            "total_reqs": sum(int(e["num_total_reqs"]) for e in entries),
            "avg_token_usage": sum(float(e["token_usage"]) for e in entries) / count,
            "avg_throughput": sum(float(e["gen_throughput"]) for e in entries) / count,
            "avg_utilization": sum(float(e["utilization"]) for e in entries) / count,
        }
    return report
