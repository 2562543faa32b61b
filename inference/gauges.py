"""The gauges that mirror the data plane's live state (admission, worker pool, per-worker status,
load and breaker, HTTP/2), read from it once a second by the telemetry sampler, never per request,
and the event loop's own (:mod:`common.runtime_metrics`: runtime, in-flight ages, allocator)."""

from __future__ import annotations

from common import telemetry
from common.relay_metrics import fold_bodies
from common.runtime_metrics import sample_runtime
from common.worker_metrics import sample_worker_http2
from inference.dataplane import DataPlane, data_plane
from inference.routing.workers import WorkerStatus

__all__ = ["sample_live_gauges"]


def sample_live_gauges(dp: DataPlane | None = None) -> None:
    """Set the live-state gauges from ``dp`` (default: this process's data plane) and its registry."""
    dp = dp or data_plane()
    permits = dp.permits
    workers = (
        telemetry.WorkerSample(
            url=handle.record.url,
            worker_type=handle.record.worker_type,
            transport=handle.record.transport,
            model=handle.record.model_id,
            ready=handle.record.status == WorkerStatus.READY,
            overloaded=handle.load.overloaded,
            in_flight=handle.load.in_flight,
            breaker_state=handle.load.breaker.state.value,
            breaker_failures=handle.load.breaker.failures,
            breaker_successes=handle.load.breaker.successes,
        )
        for handle in dp.registry.snapshot.workers
    )
    telemetry.sample_gauges(
        permits.in_flight if permits is not None else 0, permits.queued if permits is not None else 0, workers
    )
    sample_worker_http2(
        (handle.record.url, handle.record.transport, handle.record.http2) for handle in dp.registry.snapshot.workers
    )
    sample_runtime()
    fold_bodies()
