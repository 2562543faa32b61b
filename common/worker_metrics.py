"""Worker metrics of the catalog (spec 3) beside the sampled worker gauges of
:mod:`common.telemetry`, in the gateway's metrics registry.

- ``gw_worker_http2{worker}``: 1 when the gateway reaches the worker over HTTP/2, else 0, set by the
  1 s sampler (:mod:`inference.gauges`) when it changes, 0 once the worker is removed. gRPC workers
  are reached over HTTP/2 (gRPC's own transport): 1. HTTP workers: 1 when registration chose HTTP/2
  with prior knowledge (``http_pool.http2`` true, or found speaking it under --upstream-http2), else
  0 (D111). ZMQ workers: 0. GET /workers' ``http2`` is the same fact from the same function
  (:func:`http2_of`), so a gRPC worker shows true there too.
- ``gw_kv_event_subscription_failures_total{worker, reason}``: failures of the gateway's subscription
  to a worker's KV cache events. The gateway does not subscribe to KV events (its cache-aware policy
  keeps its own approximate tree of the prompts it routed; the generated TRT-LLM stub's
  ``SubscribeKvEvents`` is never called), so the family is declared and has no series.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client import Counter, Gauge

from common.telemetry import REGISTRY, _child

__all__ = ["WORKER_HTTP2", "KV_EVENT_SUBSCRIPTION_FAILURES", "http2_of", "sample_worker_http2"]

WORKER_HTTP2 = Gauge("gw_worker_http2", "1 when the worker is reached over HTTP/2, else 0", ("worker",),
                     multiprocess_mode="livemax", registry=REGISTRY)  # fmt: skip
KV_EVENT_SUBSCRIPTION_FAILURES = Counter(
    "gw_kv_event_subscription_failures_total", "Failures of KV event subscriptions to workers (none: not subscribed)",
    ("worker", "reason"), registry=REGISTRY,
)

_HTTP2_TRANSPORTS = frozenset({"grpc"})


def http2_of(transport: str, http2: bool = False) -> int:
    """1 when a worker of ``transport`` is reached over HTTP/2 (gRPC, or an HTTP worker whose
    registration chose it: ``http2``), else 0."""
    return 1 if http2 or transport in _HTTP2_TRANSPORTS else 0


_set_to: dict[str, int] = {}  # worker URL -> the value its gauge was last set to


def sample_worker_http2(workers: Iterable[tuple[str, str, bool]]) -> None:
    """Set gw_worker_http2 from (url, transport, HTTP/2 chosen) of the registered workers; 0 for
    those gone."""
    present: set[str] = set()
    for url, transport, http2 in workers:
        present.add(url)
        value = http2_of(transport, http2)
        if _set_to.get(url) != value:
            _set_to[url] = value
            _child(WORKER_HTTP2, url).set(value)
    for url in _set_to.keys() - present:
        del _set_to[url]
        _child(WORKER_HTTP2, url).set(0)
