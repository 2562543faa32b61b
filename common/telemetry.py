"""The gateway's own metrics (spec 3, Metrics catalog): the gw_* prometheus_client objects and the
small ``record_*`` helpers the request path, the health checker and the load monitor call.

Served at GET /metrics on the separate --prometheus-host:--prometheus-port listener
(:mod:`administration.metrics_server`).

Several gateway processes: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty, writable directory shared by
the processes (and cleared before they start). prometheus_client then keeps every process's values in
that directory, and whichever process holds the metrics port exports the sum over all of them
(gauges per their ``multiprocess_mode``; a stopped process's live gauges are dropped). Without it, one
in-process registry is exported, with the process and platform collectors.

Cheap on the hot path: counters and histograms are recorded where the event happens; gauges that
mirror live state (admission, workers, breakers, pools) are sampled once a second by
:func:`run_sampler` instead of being kept up to date on every request.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from bisect import bisect_left
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Awaitable, Callable, Iterable, Sequence

from common.ticks import CANARY_TICK_SECS, next_mark
from prometheus_client import values as prometheus_values
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    Summary,
)

__all__ = [
    "MULTIPROCESS",
    "MULTIPROC_DIR",
    "REGISTRY",
    "DEFAULT_DURATION_BUCKETS",
    "configure",
    "bounded_model",
    "WorkerSample",
    "sample_gauges",
    "run_sampler",
    "flush_buffered_metrics",
]


# Labelled children, memoized: prometheus_client's .labels() validates and locks on every call,
# which cost the relay ~60 us per request across its families. Label values are bounded (the model
# label is capped, workers are few), so the cache is too.
_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    key = (id(metric), labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


_adds: dict[tuple[int, tuple[str, ...]], Callable[[float], None]] = {}


def _add(counter: Any, *labels: str) -> Callable[[float], None]:
    """The increment of a counter's labelled child: its value's own ``inc``, memoized. ``Counter.inc``
    checks on every call what holds for each child here (it is observable; amounts are never
    negative): three of the four Python calls an increment cost on the request path."""
    key = (id(counter), labels)
    found = _adds.get(key)
    if found is None:
        found = _adds[key] = _child(counter, *labels)._value.inc
    return found


_observes: dict[tuple[int, tuple[str, ...]], Callable[[float], None]] = {}


def _observe(histogram: Any, *labels: str) -> Callable[[float], None]:
    """The observation of a histogram's labelled child, memoized: its sum's and its bucket's value
    increments, the bucket found by bisection (the first upper bound at or above the amount, as
    ``Histogram.observe`` finds it walking the bounds in Python, one frame per bound and a check per
    call). No exemplars (the gateway records none)."""
    key = (id(histogram), labels)
    found = _observes.get(key)
    if found is None:
        found = _observes[key] = _histogram_observe(_child(histogram, *labels))
    return found


def _histogram_observe(child: Any) -> Callable[[float], None]:
    """:func:`_observe` of one histogram child (or an unlabelled histogram itself), not memoized."""
    add_sum = child._sum.inc
    add_to = [bucket.inc for bucket in child._buckets]
    bounds = list(child._upper_bounds)  # ends with +Inf: every amount but NaN has a bucket
    top = len(bounds)

    def observe(amount: float) -> None:
        add_sum(amount)
        at = bisect_left(bounds, amount)
        if at < top and amount <= bounds[at]:  # NaN is in no bucket, as in prometheus_client
            add_to[at](1)

    return observe

log = logging.getLogger(__name__)

MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
MULTIPROCESS = MULTIPROC_DIR is not None

# Multiprocess mode writes every update into a memory-mapped file under a lock; on the request path
# that cost ~15 us per request. Counter and histogram increments are kept in memory instead and
# written by flush_buffered_metrics(): the sampler's once-a-second tick, the lifespan shutdown and
# interpreter exit (a scrape may be a second behind). ``set`` (gauges) is written at once.
_pending_lock = threading.Lock()
_buffered: list[Any] = []

if MULTIPROCESS:
    _MmapedValue: Any = prometheus_values.ValueClass

    class _BufferedValue(_MmapedValue):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._pending = 0.0
            with _pending_lock:
                _buffered.append(self)

        def inc(self, amount: float) -> None:
            with _pending_lock:
                self._pending += amount

        def set(self, value: float, timestamp: float | None = None) -> None:
            with _pending_lock:
                self._pending = 0.0
            super().set(value, timestamp)

        def get(self) -> float:
            return float(super().get()) + self._pending

    prometheus_values.ValueClass = _BufferedValue


def flush_buffered_metrics() -> None:
    """Fold the noted tokens into their counters (:func:`fold_tokens`, in either mode), then write the
    increments kept in memory to this process's multiprocess files (no-op otherwise)."""
    fold_tokens()
    if not _buffered:
        return
    with _pending_lock:
        due = [(value, value._pending) for value in _buffered if value._pending]
        for value, _ in due:
            value._pending = 0.0
    for value, amount in due:
        _MmapedValue.inc(value, amount)

# The registry the metrics port exports in single-process mode (the objects below register here; in
# multiprocess mode their values go to PROMETHEUS_MULTIPROC_DIR whatever the registry).
REGISTRY = CollectorRegistry(auto_describe=True)
if not MULTIPROCESS:
    ProcessCollector(registry=REGISTRY)
    PlatformCollector(registry=REGISTRY)

DEFAULT_DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0
)
_LOOP_DELAY_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_MAX_MODELS = 1024
OTHER = "other"

_ROUTER = ("router_type", "backend_type", "connection_mode", "model", "endpoint")
_STREAM = ("router_type", "backend_type", "model", "endpoint")

# --- runtime -------------------------------------------------------------------------------------
LOOP_DELAY = Histogram(
    "gw_runtime_event_loop_delay_seconds", "Event loop wake-up delay of a 10 ms canary",
    buckets=_LOOP_DELAY_BUCKETS, registry=REGISTRY,
)
LOOP_STALLS = Counter(
    "gw_runtime_event_loop_stalls_total", "10 ms canary wake-ups more than 5 ms late", registry=REGISTRY
)
ALIVE_TASKS = Gauge(
    "gw_runtime_alive_tasks", "asyncio tasks alive", multiprocess_mode="livesum", registry=REGISTRY
)

# --- HTTP ----------------------------------------------------------------------------------------
HTTP_REQUESTS = Counter("gw_http_requests_total", "HTTP requests", ("method", "path"), registry=REGISTRY)
HTTP_RESPONSES = Counter(
    "gw_http_responses_total", "HTTP responses", ("path", "status_code", "error_code"), registry=REGISTRY
)
HTTP_ACTIVE = Gauge(
    "gw_http_connections_active", "HTTP requests in flight", multiprocess_mode="livesum", registry=REGISTRY
)
HTTP_RATE_LIMIT = Counter("gw_http_rate_limit_total", "Rate-limit decisions", ("result",), registry=REGISTRY)

# --- admission -----------------------------------------------------------------------------------
ADMISSION_INFLIGHT = Gauge(
    "gw_admission_inflight", "Admission permits held", multiprocess_mode="livesum", registry=REGISTRY
)
ADMISSION_QUEUE = Gauge(
    "gw_admission_queue_depth", "Requests waiting for a permit", multiprocess_mode="livesum", registry=REGISTRY
)
ADMISSION_REJECTED = Counter(
    "gw_admission_queue_rejected_total", "Requests rejected by admission", ("reason",), registry=REGISTRY
)

# --- router --------------------------------------------------------------------------------------
ROUTER_REQUESTS = Counter(
    "gw_router_requests_total", "Routed requests", (*_ROUTER, "streaming"), registry=REGISTRY
)
ROUTER_ERRORS = Counter(
    "gw_router_request_errors_total", "Routed requests that failed", (*_ROUTER, "error_type"), registry=REGISTRY
)
UPSTREAM_RESPONSES = Counter(
    "gw_router_upstream_responses_total", "Worker responses",
    ("router_type", "status_code", "error_code"), registry=REGISTRY,
)
# Tokens of accounted requests (inference.kit.account, docs/DECISIONS.md D66): the spec's input and
# output counter, and the gateway's own by every token type the answer reported, whose tenant label is
# empty (Prometheus drops it) unless --usage-metrics-tenant-label turns it on.
class _FoldedCounter(Counter):
    """A counter that :func:`fold_tokens` adds to: what is noted is folded in before it is collected,
    so a scrape (or a read of the registry) sees every request accounted before it."""

    def collect(self) -> Iterable[Any]:
        fold_tokens()
        return super().collect()


ROUTER_TOKENS = _FoldedCounter(
    "gw_router_tokens_total", "Tokens of routed requests, as their answers reported them",
    ("router_type", "backend_type", "model", "endpoint", "token_type"), registry=REGISTRY,
)
USAGE_TOKENS = _FoldedCounter(
    "gw_usage_tokens_total", "Tokens of accounted requests by model and token type (and tenant, when turned on)",
    ("model", "token_type", "tenant"), registry=REGISTRY,
)

# --- workers -------------------------------------------------------------------------------------
WORKER_POOL = Gauge(
    "gw_worker_pool_size", "Registered workers", ("worker_type", "connection_mode", "model"),
    multiprocess_mode="livemax", registry=REGISTRY,
)
WORKER_ACTIVE = Gauge(
    "gw_worker_requests_active", "Requests in flight per worker", ("worker",),
    multiprocess_mode="livesum", registry=REGISTRY,
)
WORKER_HEALTH = Gauge(
    "gw_worker_health", "1 ready, 0 other, -1 removed", ("worker",), multiprocess_mode="livemax", registry=REGISTRY
)
HEALTH_CHECKS = Counter(
    "gw_worker_health_checks_total", "Health probes", ("worker_type", "result"), registry=REGISTRY
)
WORKER_SELECTION = Counter(
    "gw_worker_selection_total", "Worker selections",
    ("worker_type", "connection_mode", "model", "policy"), registry=REGISTRY,
)
WORKER_ERRORS = Counter(
    "gw_worker_errors_total", "Worker request failures",
    ("worker_type", "connection_mode", "error_type"), registry=REGISTRY,
)
WORKERS_OVERLOADED = Gauge(
    "gw_workers_overloaded", "Workers out of routing by overload protection", ("model",),
    multiprocess_mode="livemax", registry=REGISTRY,
)
OVERLOAD_SHED = Counter(
    "gw_worker_overload_shed_total", "Requests shed by overload protection", ("stage",), registry=REGISTRY
)
for _stage in ("selection", "dispatch", "pd_admission"):
    _child(OVERLOAD_SHED, _stage)

# --- circuit breakers ----------------------------------------------------------------------------
CB_STATE = Gauge(
    "gw_worker_cb_state", "0 closed, 1 open, 2 half-open, -1 removed", ("worker",),
    multiprocess_mode="livemax", registry=REGISTRY,
)
CB_TRANSITIONS = Counter(
    "gw_worker_cb_transitions_total", "Breaker state changes", ("worker", "from", "to"), registry=REGISTRY
)
CB_OUTCOMES = Counter(
    "gw_worker_cb_outcomes_total", "Outcomes recorded by breakers", ("worker", "outcome"), registry=REGISTRY
)
CB_FAILURES = Gauge(
    "gw_worker_cb_consecutive_failures", "Breaker failure streak", ("worker",),
    multiprocess_mode="livemax", registry=REGISTRY,
)
CB_SUCCESSES = Gauge(
    "gw_worker_cb_consecutive_successes", "Breaker success streak", ("worker",),
    multiprocess_mode="livemax", registry=REGISTRY,
)

# --- retries -------------------------------------------------------------------------------------
TOKENIZER_CACHE_LOOKUPS = Counter(
    "gw_tokenizer_cache_lookups_total", "Tokenizer cache lookups", ("layer", "result"), registry=REGISTRY
)
TOKENIZER_CACHE_EVICTIONS = Counter(
    "gw_tokenizer_cache_evictions_total", "Tokenizer cache entries dropped for room", ("layer",), registry=REGISTRY
)
TOKENIZER_CACHE_REUSED = Counter(
    "gw_tokenizer_cache_reused_bytes_total", "Prompt bytes whose tokens came from the cache", ("layer",),
    registry=REGISTRY,
)
RETRIES = Counter("gw_worker_retries_total", "Retries on another worker", ("worker_type", "endpoint"), registry=REGISTRY)
RETRIES_EXHAUSTED = Counter(
    "gw_worker_retries_exhausted_total", "Retryable outcomes with no retry left",
    ("worker_type", "endpoint"), registry=REGISTRY,
)
# prometheus_client summaries export _count and _sum only (no quantiles).
RETRY_BACKOFF = Summary("gw_worker_retry_backoff_seconds", "Backoff before a retry", ("attempt",), registry=REGISTRY)

# --- engine gauges from load reports ---------------------------------------------------------------
_ENGINE_FIELDS = (
    ("running_requests", "num_running_reqs"),
    ("waiting_requests", "num_waiting_reqs"),
    ("token_usage", "token_usage"),
    ("gen_throughput", "gen_throughput"),
    ("cache_hit_rate", "cache_hit_rate"),
)
_ENGINE_PD_FIELDS = (
    ("pd_kv_transfer_latency_ms", "kv_transfer_latency_ms"),
    ("pd_kv_transfer_speed_gb_s", "kv_transfer_speed_gb_s"),
    ("pd_prefill_queue_reqs", "prefill_queue_reqs"),
    ("pd_decode_queue_reqs", "decode_queue_reqs"),
)
ENGINE = {
    key: Gauge(f"gw_engine_{name}", f"Engine {name} from load reports (-1: no report)", ("worker", "model", "dp_rank"),
               multiprocess_mode="livemostrecent", registry=REGISTRY)
    for name, key in _ENGINE_FIELDS
}
ENGINE_PD = {
    key: Gauge(f"gw_engine_{name}", f"Engine {name} from load reports (-1: no report)", ("worker", "role", "dp_rank"),
               multiprocess_mode="livemostrecent", registry=REGISTRY)
    for name, key in _ENGINE_PD_FIELDS
}

# --- worker discovery (administration/discovery_reconcile.py, D73): source is the provider ---------
DISCOVERY_REGISTRATIONS = Counter(
    "gw_discovery_registrations_total", "Discovered workers handed to registration", ("source", "result"),
    registry=REGISTRY,
)
DISCOVERY_DEREGISTRATIONS = Counter(
    "gw_discovery_deregistrations_total", "Discovered workers drained and removed", ("source", "reason"),
    registry=REGISTRY,
)
DISCOVERY_SYNC = Histogram(
    "gw_discovery_sync_duration_seconds", "One reconcile pass of discovery against the store", ("source",),
    buckets=DEFAULT_DURATION_BUCKETS, registry=REGISTRY,
)
DISCOVERY_WORKERS = Gauge(
    "gw_discovery_workers_discovered", "Workers the provider currently reports", ("source",),
    multiprocess_mode="livemax", registry=REGISTRY,
)


def record_discovery_pass(
    source: str, discovered: int, registered: int, failed: int, removed: int, duration_secs: float
) -> None:
    """One discovery reconcile pass: what it found, registered, failed to register and removed."""
    _child(DISCOVERY_WORKERS, source).set(discovered)
    if registered:
        _child(DISCOVERY_REGISTRATIONS, source, "success").inc(registered)
    if failed:
        _child(DISCOVERY_REGISTRATIONS, source, "failed").inc(failed)
    if removed:
        _child(DISCOVERY_DEREGISTRATIONS, source, "reconciled").inc(removed)
    _child(DISCOVERY_SYNC, source).observe(duration_secs)


# --- duration histograms (buckets from --prometheus-duration-buckets) ------------------------------
def _histograms(buckets: Sequence[float]) -> tuple[Histogram, Histogram, Histogram, Histogram, Histogram]:
    return (
        Histogram("gw_http_request_duration_seconds", "Time to the response head", ("method", "path"),
                  buckets=buckets, registry=REGISTRY),
        Histogram("gw_router_request_duration_seconds", "Routed request duration", _ROUTER,
                  buckets=buckets, registry=REGISTRY),
        Histogram("gw_router_ttft_seconds", "Time to the first streamed chunk", _STREAM,
                  buckets=buckets, registry=REGISTRY),
        Histogram("gw_router_generation_duration_seconds", "Time to the last streamed chunk", _STREAM,
                  buckets=buckets, registry=REGISTRY),
        Histogram("gw_router_tpot_seconds", "Time per output token after the first (from the streamed events)",
                  _STREAM, buckets=buckets, registry=REGISTRY),
    )


_buckets: tuple[float, ...] = DEFAULT_DURATION_BUCKETS
HTTP_DURATION, ROUTER_DURATION, TTFT, GENERATION, TPOT = _histograms(_buckets)


def configure(buckets: Iterable[float]) -> None:
    """Use ``buckets`` (seconds; empty: the defaults) for the duration histograms. Call at startup."""
    global _buckets, HTTP_DURATION, ROUTER_DURATION, TTFT, GENERATION, TPOT
    wanted = tuple(sorted(buckets)) or DEFAULT_DURATION_BUCKETS
    if wanted == _buckets:
        return
    for histogram in (HTTP_DURATION, ROUTER_DURATION, TTFT, GENERATION, TPOT):
        REGISTRY.unregister(histogram)
    _buckets = wanted
    HTTP_DURATION, ROUTER_DURATION, TTFT, GENERATION, TPOT = _histograms(wanted)


# --- label bounds --------------------------------------------------------------------------------
_models: set[str] = set()


def bounded_model(model: str | None) -> str:
    """The model label: the first 1,024 distinct values, then ``other``."""
    if not model:
        return ""
    if model in _models:
        return model
    if len(_models) >= _MAX_MODELS:
        return OTHER
    _models.add(model)
    return model


def backend_type(worker_type: str) -> str:
    return "pd" if worker_type in ("prefill", "decode") else worker_type


# --- HTTP helpers (the lifecycle gate wraps the data-plane routes) -----------------------------------
# The timers of the data-plane requests in flight, for gw_http_inflight_request_age_count (its
# sampler reads their start times: common/runtime_metrics.py); a set's add and discard per request.
INFLIGHT: set[HttpTimer] = set()
_inflight_add = INFLIGHT.add
_inflight_discard = INFLIGHT.discard

_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})


class HttpTimer:
    """Wraps ``send`` of one data-plane request: counts it, times it to the response head, counts the
    response by status and gateway error code. ``responded``: the response head went out."""

    __slots__ = ("path", "method", "started", "responded", "_send")

    def __init__(self, path: str, method: str, send: Any) -> None:
        self.path = path
        self.method = method if method in _METHODS else "OTHER"
        self.started = perf_counter()
        self.responded = False
        self._send = send
        _add(HTTP_REQUESTS, self.method, path)(1)
        HTTP_ACTIVE._value.inc(1)  # Gauge.inc less its check (an unlabelled gauge is observable)
        _inflight_add(self)

    def send(self, message: Any) -> Awaitable[None]:
        """The ASGI send: a plain function returning the server's send, no coroutine of its own per
        message (issue 27, D86); callers await it at once, as any send."""
        if message["type"] == "http.response.start":
            self.responded = True
            _observe(HTTP_DURATION, self.method, self.path)(perf_counter() - self.started)
            error_code = ""
            for key, value in message.get("headers") or ():
                if key == b"x-gw-error-code":
                    error_code = value.decode("latin-1")
                    break
            _add(HTTP_RESPONSES, self.path, str(message["status"]), error_code)(1)
        return self._send(message)

    def done(self) -> None:
        HTTP_ACTIVE._value.inc(-1)  # Gauge.dec
        _inflight_discard(self)


def body_send(send: Any) -> Any:
    """The send for a response's body messages once its head went out: the server's own send when
    ``send`` is an :meth:`HttpTimer.send` that passed the head (the timer reads nothing else: one
    call less per streamed chunk, D115), else ``send`` itself."""
    timer = getattr(send, "__self__", None)
    if type(timer) is HttpTimer and timer.responded and getattr(send, "__func__", None) is HttpTimer.send:
        return timer._send
    return send


def record_rate_limit(allowed: bool) -> None:
    _child(HTTP_RATE_LIMIT, "allowed" if allowed else "rejected").inc()


# --- admission -----------------------------------------------------------------------------------
def record_admission_rejected(reason: str) -> None:
    _child(ADMISSION_REJECTED, reason).inc()


# --- routed requests -----------------------------------------------------------------------------
_ERROR_TYPES = {
    "no_healthy_workers": "no_workers",
    "model_not_found": "no_workers",
    "worker_overload_protection_shed": "no_workers",
    "upstream_timeout": "timeout",
    "admission_queue_timeout": "timeout",
    "upstream_unavailable": "backend_error",
    "json_parse_error": "parse_error",
    "internal_error": "internal_error",
}
_ADMISSION_REASONS = {
    "multimodal_payload_too_large": "multimodal_too_large",
    "multimodal_inflight_budget": "multimodal_inflight",
}


class RouteTimer:
    """One routed request's router metrics. The labels that depend on the worker (router_type and
    connection_mode from its transport, backend_type from its type) are set once it is chosen."""

    __slots__ = ("endpoint", "model", "stream", "started", "backend", "router", "mode")

    def __init__(self, endpoint: str, model: str | None, stream: bool, started: float) -> None:
        self.endpoint = endpoint
        self.model = bounded_model(model)
        self.stream = stream
        self.started = started
        self.backend = "regular"
        self.router = "http"  # router_type: how the gateway talks to the chosen worker
        self.mode = "http"  # connection_mode

    def selected(self, worker_type: str, connection_mode: str, policy: str, router_type: str) -> None:
        self.backend = backend_type(worker_type)
        self.router = router_type
        self.mode = connection_mode
        _add(ROUTER_REQUESTS, router_type, self.backend, connection_mode, self.model, self.endpoint,
             "true" if self.stream else "false")(1)
        _add(WORKER_SELECTION, worker_type, connection_mode, self.model, policy)(1)

    def finished(self) -> None:
        _observe(ROUTER_DURATION, self.router, self.backend, self.mode, self.model, self.endpoint)(
            perf_counter() - self.started
        )

    def disaggregated(self) -> None:
        """The request goes through prefill/decode disaggregation (known before its pair is chosen)."""
        self.backend = "pd"

    def failed(self, code: str, status: int) -> None:
        reason = _ADMISSION_REASONS.get(code)
        if reason is not None:
            _child(ADMISSION_REJECTED, reason).inc()
        if code == "worker_overload_protection_shed":
            # A PD request is shed by PD admission (inference/kit/pd_route.py), any other by selection.
            _child(OVERLOAD_SHED, "pd_admission" if self.backend == "pd" else "selection").inc()
        error_type = _ERROR_TYPES.get(code) or ("validation_error" if status < 500 else "backend_error")
        _child(ROUTER_ERRORS, self.router, self.backend, self.mode, self.model, self.endpoint, error_type).inc()

    def upstream_status(self, status: int) -> None:
        """A worker answered with ``status`` (each attempt)."""
        _add(UPSTREAM_RESPONSES, self.router, str(status), "")(1)

    # The response writer's stream observer.
    def first_chunk(self, at: float) -> None:
        _observe(TTFT, self.router, self.backend, self.model, self.endpoint)(at - self.started)

    def stream_ended(self, first_at: float, ended_at: float, events: int) -> None:
        """Generation duration, and TPOT over the events after the first. Engines stream one token
        per event (sglang, vllm), so events stand for tokens; the closing [DONE] is not one."""
        _observe(GENERATION, self.router, self.backend, self.model, self.endpoint)(ended_at - self.started)
        tokens = events - 1
        if tokens >= 2:
            _observe(TPOT, self.router, self.backend, self.model, self.endpoint)((ended_at - first_at) / (tokens - 1))


_token_children: dict[tuple[str, ...], tuple[Any, ...]] = {}
# The accounted requests' tokens not yet added to the counters (note_tokens); fold_tokens takes what is
# there and removes exactly that.
_tokens_due: list[tuple[Any, ...]] = []
_fold_lock = threading.Lock()


# The request path's note of one accounted request's tokens for fold_tokens: (route, model, tenant,
# usage), the usage anything with prompt, completion, cached and reasoning counts (the account's own
# TokenUsage). A list's append, one C call under the GIL: no lock and no frame of ours per request,
# where up to six locked counter increments were a third of its accounting (D96). The counters read
# them folded in (:class:`_FoldedCounter`).
note_tokens: Callable[[tuple[RouteTimer | None, str, str, Any]], None] = _tokens_due.append


def fold_tokens() -> None:
    """Add the tokens noted (:data:`note_tokens`) to their counters: whenever the token counters are
    collected (a scrape, a test's read), at the sampler's once-a-second tick (so multiprocess mode's
    files, which another process exports, follow within about a second, as its buffered increments
    do) and at exit. The labelled children of one (route, model, tenant) are looked up once."""
    if not _tokens_due:
        return
    with _fold_lock:  # two folds at once would both take the same first rows
        count = len(_tokens_due)
        due = _tokens_due[:count]
        del _tokens_due[:count]  # appends since are past ``count``: kept for the next fold
        sums: dict[tuple[str, ...], list[int]] = {}
        key: tuple[str, ...]
        for route, model, tenant, usage in due:
            key = (route.router, route.backend, route.endpoint, model, tenant) if route is not None \
                else ("", "", "", model, tenant)
            total = sums.get(key)
            if total is None:
                sums[key] = [usage.prompt, usage.completion, usage.cached, usage.reasoning, route is not None]
            else:
                total[0] += usage.prompt
                total[1] += usage.completion
                total[2] += usage.cached
                total[3] += usage.reasoning
        for key, (prompt, completion, cached, reasoning, routed) in sums.items():
            children = _token_children.get(key)
            if children is None:
                router, backend, endpoint, model, tenant = key
                bounded = bounded_model(model)
                pair: tuple[Any, ...] = (None, None)
                if routed:
                    labels = (router, backend, bounded, endpoint)
                    pair = (_add(ROUTER_TOKENS, *labels, "input"), _add(ROUTER_TOKENS, *labels, "output"))
                children = _token_children[key] = (*pair, *(
                    _add(USAGE_TOKENS, bounded, kind, tenant) for kind in ("prompt", "completion", "cached", "reasoning")
                ))  # fmt: skip
            routed_in, routed_out, by_prompt, by_completion, by_cached, by_reasoning = children
            if prompt:
                by_prompt(prompt)
                if routed_in is not None:
                    routed_in(prompt)
            if completion:
                by_completion(completion)
                if routed_out is not None:
                    routed_out(completion)
            if cached:
                by_cached(cached)
            if reasoning:
                by_reasoning(reasoning)


def record_worker_error(worker_type: str, connection_mode: str, timeout: bool) -> None:
    _child(WORKER_ERRORS, worker_type, connection_mode, "timeout" if timeout else "backend_error").inc()


def record_breaker_outcome(worker: str, failed: bool) -> None:
    _add(CB_OUTCOMES, worker, "failure" if failed else "success")(1)


def record_retry(worker_type: str, endpoint: str, attempt: int, backoff_secs: float) -> None:
    _child(RETRIES, worker_type, endpoint).inc()
    _child(RETRY_BACKOFF, str(attempt)).observe(backoff_secs)


def record_retries_exhausted(worker_type: str, endpoint: str) -> None:
    _child(RETRIES_EXHAUSTED, worker_type, endpoint).inc()


def record_tokenizer_cache_lookup(layer: str, hit: bool, reused_bytes: int) -> None:
    """Once or twice per served request (D114: the memoized increments, no ``Counter.inc`` checks;
    ``reused_bytes`` is a length, never negative)."""
    _add(TOKENIZER_CACHE_LOOKUPS, layer, "hit" if hit else "miss")(1)
    if reused_bytes:
        _add(TOKENIZER_CACHE_REUSED, layer)(reused_bytes)


def record_tokenizer_cache_eviction(layer: str) -> None:
    _child(TOKENIZER_CACHE_EVICTIONS, layer).inc()


# --- breakers ------------------------------------------------------------------------------------
CB_VALUES = {"closed": 0, "open": 1, "half_open": 2}  # gw_worker_cb_state per breaker state


def record_breaker_transition(worker: str, old: str, new: str) -> None:
    """A breaker moved from state ``old`` to ``new`` (the breaker reports it with its worker's label)."""
    _child(CB_TRANSITIONS, worker, old, new).inc()
    _child(CB_STATE, worker).set(CB_VALUES[new])


# --- health checks and load reports ---------------------------------------------------------------
def record_health_check(worker_type: str, healthy: bool) -> None:
    _child(HEALTH_CHECKS, worker_type, "success" if healthy else "failure").inc()


# worker URL -> the (model or role, dp_rank) label pairs its engine gauges were set for.
_engine_series: dict[str, set[tuple[str, str]]] = {}
_engine_pd_series: dict[str, set[tuple[str, str]]] = {}


def record_engine_load(worker: str, model: str | None, entries: Sequence[dict[str, Any]] | None) -> None:
    """Engine gauges from one load report; None (failed poll, or worker not ready) sets them to -1."""
    if entries is None:
        _clear_engine(worker)
        return
    model_label = bounded_model(model)
    series = _engine_series.setdefault(worker, set())
    pd_series = _engine_pd_series.setdefault(worker, set())
    for entry in entries:
        rank = str(entry.get("dp_rank", 0))
        series.add((model_label, rank))
        for key, gauge in ENGINE.items():
            _child(gauge, worker, model_label, rank).set(float(entry.get(key) or 0.0))
        if any(key in entry for key in ENGINE_PD):
            role = str(entry.get("disagg_mode") or entry.get("worker_type") or "")
            pd_series.add((role, rank))
            for key, gauge in ENGINE_PD.items():
                _child(gauge, worker, role, rank).set(float(entry.get(key) or 0.0))


def _clear_engine(worker: str) -> None:
    for model_label, rank in _engine_series.get(worker, ()):
        for gauge in ENGINE.values():
            _child(gauge, worker, model_label, rank).set(-1)
    for role, rank in _engine_pd_series.get(worker, ()):
        for gauge in ENGINE_PD.values():
            _child(gauge, worker, role, rank).set(-1)


# --- sampled gauges ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkerSample:
    """One worker's live state as the sampler reads it (from the data plane's registry snapshot)."""

    url: str
    worker_type: str
    transport: str
    model: str | None
    ready: bool
    overloaded: bool
    in_flight: int
    breaker_state: str
    breaker_failures: int
    breaker_successes: int


_seen_workers: set[str] = set()
# worker URL -> what its per-worker gauges were last set to (a fleet's gauges are set when they change,
# not every worker's every second)
_worker_values: dict[str, tuple[bool, int, str, int, int]] = {}
_pool_series: set[tuple[str, str, str]] = set()
_overload_series: set[str] = set()


def sample_gauges(permits_in_flight: int, permits_queued: int, workers: Iterable[WorkerSample]) -> None:
    """Set the gauges that mirror live state: admission, worker pool, per-worker status, load and
    breaker; workers that left get -1 (health, breaker state, engine) and 0 (load, streaks)."""
    ADMISSION_INFLIGHT.set(permits_in_flight)
    ADMISSION_QUEUE.set(permits_queued)
    try:
        ALIVE_TASKS.set(len(asyncio.all_tasks()))
    except RuntimeError:
        pass
    pools: dict[tuple[str, str, str], int] = {}
    overloaded: dict[str, int] = {}
    present: set[str] = set()
    for worker in workers:
        url = worker.url
        present.add(url)
        model = bounded_model(worker.model)
        key = (worker.worker_type, worker.transport, model)
        pools[key] = pools.get(key, 0) + 1
        if worker.overloaded:
            overloaded[model] = overloaded.get(model, 0) + 1
        values = (worker.ready, worker.in_flight, worker.breaker_state, worker.breaker_failures, worker.breaker_successes)
        if _worker_values.get(url) == values:
            continue
        _worker_values[url] = values
        _child(WORKER_HEALTH, url).set(1 if worker.ready else 0)
        _child(WORKER_ACTIVE, url).set(worker.in_flight)
        _child(CB_STATE, url).set(CB_VALUES.get(worker.breaker_state, 0))
        _child(CB_FAILURES, url).set(worker.breaker_failures)
        _child(CB_SUCCESSES, url).set(worker.breaker_successes)
        if not worker.ready:
            _clear_engine(url)
    for url in _seen_workers - present:
        _worker_values.pop(url, None)
        _child(WORKER_HEALTH, url).set(-1)
        _child(CB_STATE, url).set(-1)
        _child(WORKER_ACTIVE, url).set(0)
        _child(CB_FAILURES, url).set(0)
        _child(CB_SUCCESSES, url).set(0)
        _clear_engine(url)
    _seen_workers.clear()
    _seen_workers.update(present)
    for pool_key in _pool_series - pools.keys():
        _child(WORKER_POOL, *pool_key).set(0)
    for pool_key, count in pools.items():
        _child(WORKER_POOL, *pool_key).set(count)
    _pool_series.update(pools)
    for model in _overload_series - overloaded.keys():
        _child(WORKERS_OVERLOADED, model).set(0)
    for model, count in overloaded.items():
        _child(WORKERS_OVERLOADED, model).set(count)
    _overload_series.update(overloaded)


def mark_process_dead() -> None:
    """Write what is buffered, then drop this process's live gauges from the multiprocess export (at
    shutdown; idempotent)."""
    flush_buffered_metrics()
    if MULTIPROCESS:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())


# Also at interpreter exit: daphne sends no lifespan shutdown, and any other process that imports this
# module (manage.py commands, a Celery worker) creates live gauge files too (unlabelled gauges exist
# from import time).
if MULTIPROCESS:
    atexit.register(mark_process_dead)
    atexit.register(flush_buffered_metrics)  # runs first (atexit is last in, first out)


_STALL_SECS = 0.005


async def run_sampler(sample: Callable[[], None], interval: float = 1.0) -> None:
    """The event-loop canary (every 10 ms, on the marks of the 10 ms grid the background loops'
    timers share: common/ticks.py), and ``sample`` (the gauges that mirror live state) every
    ``interval`` seconds, until cancelled.

    Each tick is a plain timer callback (``loop.call_at``), not a coroutine sleeping: an idle process
    wakes 100 times a second for it, and ``asyncio.sleep`` cost each wake a future, a task step one
    loop iteration later (a second ``epoll_wait``) and a ``getpid`` (D94). The lateness is measured
    when the timer runs, and the observation goes straight to the histogram's values."""
    loop = asyncio.get_running_loop()
    observe = _histogram_observe(LOOP_DELAY)
    stalled = LOOP_STALLS._value.inc
    next_sample = loop.time()
    due = next_mark(loop.time(), 0.0, CANARY_TICK_SECS)
    handle: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal due, next_sample, handle
        now = loop.time()
        late = max(0.0, now - due)
        due = max(due + CANARY_TICK_SECS, next_mark(now, 0.0, CANARY_TICK_SECS))  # marks missed are skipped
        handle = loop.call_at(due, tick)
        observe(late)
        if late > _STALL_SECS:
            stalled(1)
        if now >= next_sample:
            next_sample = loop.time() + interval
            try:
                sample()
                flush_buffered_metrics()
            except Exception:  # never let a metrics bug stop the sampler
                log.exception("metrics sampling failed")

    handle = loop.call_at(due, tick)
    try:
        await loop.create_future()  # resolved by nothing: the ticks run until this is cancelled
    finally:
        handle.cancel()
