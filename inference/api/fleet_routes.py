"""Public fleet routes (spec 3, Cache and load; Model and server information; Probes and metrics):

* ``GET /loads``: the load monitor's cached snapshot (no worker call), ``?model=`` filters;
* ``GET /get_model_info``, ``GET /get_server_info``: forwarded to the first healthy regular HTTP
  worker, its answer returned as is;
* ``GET /health_generate``: forwarded to a healthy HTTP worker;
* ``GET /engine_metrics``: every worker's own Prometheus exposition in one, each sample labelled
  ``worker_addr="<base url>"``.

The worker calls share one httpx client per event loop (these are operator and probe routes, not the
inference hot path).
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime, timezone
from typing import Any, Iterable, NotRequired, TypedDict
from urllib.parse import parse_qs

import httpx

from administration.control_http import http_client

from inference import errors
from inference.api.asgi_io import Receive, Scope, Send, request_id_for, send_error, send_json, send_response
from inference.routing.registry import RegistrySnapshot, WorkerHandle, WorkerRegistry
from inference.runtime import runtime

__all__ = [
    "GATEWAY_VERSION",
    "LoadsReport",
    "loads_report",
    "merge_expositions",
    "loads",
    "get_model_info",
    "get_server_info",
    "health_generate",
    "engine_metrics",
]

GATEWAY_VERSION = "0.1.0"
_FORWARD_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
_SCRAPE_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_PLAIN = b"text/plain; charset=utf-8"

# --- /loads ---------------------------------------------------------------------------------------


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


def _query(scope: Scope, name: str) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[0] if values else None


async def _get_only(scope: Scope, send: Send, request_id: bytes) -> bool:
    if scope["method"] in ("GET", "HEAD"):
        return True
    await send_error(send, errors.method_not_allowed(scope["method"], scope["path"], "GET"), request_id)
    return False


async def loads(scope: Scope, receive: Receive, send: Send) -> None:
    request_id = request_id_for(scope)
    if await _get_only(scope, send, request_id):
        await send_json(send, 200, loads_report(runtime().registry, _query(scope, "model") or None), request_id)


# --- forwarding to one worker ----------------------------------------------------------------------


def _is_http(handle: WorkerHandle) -> bool:
    return handle.url.startswith(("http://", "https://")) and handle.record.runtime_type != "external"


def _healthy_http(snapshot: RegistrySnapshot, regular_only: bool) -> WorkerHandle | None:
    for handle in snapshot.workers:
        if handle.record.status != "ready" or not _is_http(handle):
            continue
        if regular_only and handle.record.worker_type != "regular":
            continue
        return handle
    return None


def _auth(handle: WorkerHandle) -> dict[str, str]:
    key = handle.record.api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def _forwarder(worker_path: str, regular_only: bool) -> Any:
    async def forward(scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_id_for(scope)
        if not await _get_only(scope, send, request_id):
            return
        handle = _healthy_http(runtime().registry.snapshot, regular_only)
        if handle is None:
            await send_error(send, errors.no_healthy_workers(None), request_id)
            return
        try:
            response = await http_client().get(handle.url + worker_path, headers=_auth(handle), timeout=_FORWARD_TIMEOUT)
        except httpx.TimeoutException:
            await send_error(send, errors.upstream_timeout(_FORWARD_TIMEOUT.read or 0), request_id)
            return
        except httpx.HTTPError as exc:
            await send_error(send, errors.upstream_unavailable(type(exc).__name__), request_id)
            return
        headers = [(b"x-request-id", request_id)]
        content_type = response.headers.get("content-type")
        if content_type:
            headers.append((b"content-type", content_type.encode("latin-1")))
        await send_response(send, response.status_code, response.content, headers)

    return forward


get_model_info = _forwarder("/get_model_info", regular_only=True)
get_server_info = _forwarder("/get_server_info", regular_only=True)
health_generate = _forwarder("/health_generate", regular_only=False)


# --- /engine_metrics --------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labelled(line: str, label: str) -> str:
    """``line`` (one sample) with ``label`` added first among its labels."""
    match = _NAME.match(line)
    if match is None:
        return line
    end = match.end()
    if line[end : end + 1] == "{":
        rest = line[end + 1 :]
        separator = "" if rest.lstrip().startswith("}") else ","
        return f"{line[:end]}{{{label}{separator}{rest}"
    return f"{line[:end]}{{{label}}}{line[end:]}"


def _family_of(line: str) -> str | None:
    """The metric family a ``# HELP`` / ``# TYPE`` line declares."""
    parts = line.split(None, 3)
    if len(parts) >= 3 and parts[0] == "#" and parts[1] in ("HELP", "TYPE"):
        return parts[2]
    return None


def merge_expositions(scrapes: Iterable[tuple[str, str]]) -> str:
    """One exposition from ``(base_url, text)`` pairs: families kept together (HELP and TYPE once,
    from the first worker that declares them), every sample labelled with its worker's base URL.
    Names, help text and label values are passed through unchanged."""
    order: list[str] = []
    headers: dict[str, dict[str, str]] = {}  # family -> {"HELP": line, "TYPE": line}
    samples: dict[str, list[str]] = {}

    def family_entry(family: str) -> None:
        if family not in samples:
            headers[family], samples[family] = {}, []
            order.append(family)

    for base_url, text in scrapes:
        label = f'worker_addr="{_escape(base_url)}"'
        current: str | None = None
        for raw in text.splitlines():
            line = raw.rstrip()
            if not line:
                continue
            if line.startswith("#"):
                family = _family_of(line)
                if family is None:
                    continue  # other comments (and EOF markers) are dropped
                current = family
                family_entry(family)
                headers[family].setdefault(line.split(None, 2)[1], line)
                continue
            match = _NAME.match(line)
            if match is None:
                continue
            name = match.group(0)
            family = current if current is not None and name.startswith(current) else name
            family_entry(family)
            samples[family].append(_labelled(line, label))
    lines: list[str] = []
    for family in order:
        lines.extend(headers[family][kind] for kind in ("HELP", "TYPE") if kind in headers[family])
        lines.extend(samples[family])
    return "\n".join(lines) + "\n" if lines else ""


def _base_url(url: str) -> str:
    return url.split("@", 1)[0].rstrip("/")


async def _scrape(base_url: str, api_key: str | None) -> str | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = await http_client().get(base_url + "/metrics", headers=headers, timeout=_SCRAPE_TIMEOUT)
    except httpx.HTTPError:
        return None
    return response.text if response.is_success else None


async def engine_metrics(scope: Scope, receive: Receive, send: Send) -> None:
    request_id = request_id_for(scope)
    if not await _get_only(scope, send, request_id):
        return
    keys: dict[str, str | None] = {}
    for handle in runtime().registry.snapshot.workers:
        if handle.url.startswith(("http://", "https://")):
            keys.setdefault(_base_url(handle.url), handle.record.api_key)
    headers = [(b"x-request-id", request_id)]
    if not keys:
        await send_response(send, 500, b"No workers available", [(b"content-type", _PLAIN), *headers])
        return
    texts = await asyncio.gather(*(_scrape(url, key) for url, key in keys.items()))
    scraped = [(url, text) for url, text in zip(keys, texts) if text is not None]
    if not scraped:
        body = b"Failed to scrape metrics from any worker"
        await send_response(send, 500, body, [(b"content-type", _PLAIN), *headers])
        return
    body = merge_expositions(scraped).encode()
    await send_response(send, 200, body, [(b"content-type", _METRICS_TYPE), *headers])
