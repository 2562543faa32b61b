"""The request-body and resend metrics of the router in the catalog (spec 3), in the gateway's
metrics registry (:mod:`common.telemetry`), counted for what the gateway does with a request body.

- ``gw_router_request_body_path_total{path, reason}``: each routed request by how its body reached
  the worker. The gateway reads every body whole before it routes (the surface's validation parses
  it: the model and ``stream`` choose the worker, and the body may be rewritten, e.g. the usage
  option of a stream or a DP rank) and keeps it until the request ends (a retry on another worker
  resends it), so one pair occurs: ``buffered`` / ``parsed``. ``streamed`` (a body passed on as it
  arrives) does not occur: the gateway streams no request body.
- ``gw_router_request_buffers_released_early_bytes_total``: bytes of request bodies let go before
  their request ended; the gateway keeps each body to the end for its retries, so this stays 0.
- ``gw_router_upstream_send_retries_total{router_type}``: resends of a request on the same worker
  when its first send failed before any response: the HTTP relay's request written on a pooled
  keep-alive connection the worker had closed (it hung up or reset before any byte of an answer),
  sent once more on a new connection, and an HTTP/2 stream the worker did not process (GOAWAY,
  REFUSED_STREAM) sent once more (D113). Pooled connections are reused only within 3 s, under the
  engines' 5 s keep-alive (:data:`inference.upstreams.http.KEEPALIVE_SECS`), so this is rare: a
  worker closing sooner, or restarted. Any other failed send goes to the retry policy on another
  worker (``gw_worker_retries_total``). The family is declared before its first resend.
"""

from __future__ import annotations

import threading
from itertools import count
from typing import Any, Iterable

from prometheus_client import Counter

from common.telemetry import REGISTRY, _add

__all__ = [
    "BODY_PATH",
    "BUFFERS_RELEASED_EARLY",
    "UPSTREAM_SEND_RETRIES",
    "BUFFERED_PARSED",
    "count_buffered_body",
    "fold_bodies",
]


class _FoldedBodies(Counter):
    """The body-path counter, with the routed requests counted since folded in before it is collected."""

    def collect(self) -> Iterable[Any]:
        fold_bodies()
        return super().collect()


UPSTREAM_SEND_RETRIES = Counter(
    "gw_router_upstream_send_retries_total", "Resends on the same worker after a first send failed before any response",
    ("router_type",), registry=REGISTRY,
)
BODY_PATH = _FoldedBodies("gw_router_request_body_path_total", "Routed requests by how their body reached the worker",
                    ("path", "reason"), registry=REGISTRY)  # fmt: skip
BUFFERS_RELEASED_EARLY = Counter(
    "gw_router_request_buffers_released_early_bytes_total", "Request body bytes let go before their request ended",
    registry=REGISTRY,
)

BUFFERED_PARSED = ("buffered", "parsed")

# The request path's one call per routed request: the next number of a C counter (~0.1k instructions,
# where a prometheus_client increment, a Python method taking a lock, cost ~2.7k: D100), folded into
# BODY_PATH by fold_bodies: whenever it is collected, and by the 1 s sampler (inference/gauges.py, so
# that multiprocess mode's files, which another process exports, follow within about a second).
_routed = count()
count_buffered_body = _routed.__next__
_fold_lock = threading.Lock()
_taken = [0, 0]  # numbers the folds took from _routed themselves, requests folded


def fold_bodies() -> None:
    """Add the routed requests counted since the last fold to ``BODY_PATH{buffered, parsed}``."""
    with _fold_lock:
        reached = next(_routed)  # the numbers handed out so far: requests plus this fold's own
        _taken[0] += 1
        requests = reached + 1 - _taken[0]
        due = requests - _taken[1]
        if due:
            _taken[1] = requests
            _add(BODY_PATH, *BUFFERED_PARSED)(due)
