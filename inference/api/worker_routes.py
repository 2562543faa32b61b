"""Public fleet routes (spec 3, Cache and load; Model and server information; Probes and metrics):

* ``GET /loads``: the load monitor's cached snapshot (no worker call), ``?model=`` filters;
* ``GET /get_model_info``, ``GET /get_server_info``: forwarded to the first healthy regular HTTP
  worker (first healthy prefill worker in HTTP PD mode), its answer returned as is; 501 when only
  gRPC or ZMQ workers are registered;
* ``GET /health_generate``: forwarded to the first healthy regular HTTP worker (in HTTP PD mode to
  the first healthy prefill and decode workers); 501 when only gRPC or ZMQ workers are registered;
* ``GET /engine_metrics``: every worker's own Prometheus exposition in one, each sample labelled
  ``worker_addr="<base url>"``.

The worker calls share one httpx client per event loop (these are operator and probe routes, not the
inference hot path).
"""

from __future__ import annotations

import asyncio
import re
from typing import Iterable, Sequence
from urllib.parse import parse_qs

import httpx

from common.http_clients import http_client

from inference import errors
from inference.asgi_io import ASGIApp, Receive, Scope, Send, request_id_for, send_error, send_json, send_response
from inference.routing.load_report import loads_report
from inference.routing.registry import RegistrySnapshot
from inference.routing.workers import Transport, WorkerHandle, WorkerKind, WorkerStatus, WorkerType
from inference.dataplane import data_plane

__all__ = [
    "merge_expositions",
    "loads",
    "get_model_info",
    "get_server_info",
    "health_generate",
    "engine_metrics",
    "is_pd_mode",
]

_FORWARD_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
_SCRAPE_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_PLAIN = b"text/plain; charset=utf-8"

# --- /loads ---------------------------------------------------------------------------------------


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
        await send_json(send, 200, loads_report(data_plane().registry, _query(scope, "model") or None), request_id)


# --- forwarding to one worker (or one prefill/decode pair) -------------------------------------------
#
# Which workers answer, from the registry snapshot (spec 3, Model and server information; Probes):
#
# * candidates are the HTTP workers (http:// or https://, not external providers);
# * none, but gRPC or ZMQ workers are registered: 501 endpoint_not_supported ("gRPC and ZMQ
#   deployments 501"); none at all: 503 no_healthy_workers;
# * HTTP PD mode: no regular HTTP worker is registered and at least one prefill or decode HTTP worker
#   is. The mode follows what is registered, not what is healthy, so a regular fleet whose workers are
#   all down answers 503 rather than switching to prefill workers;
# * /get_model_info, /get_server_info: the first ready regular worker, in PD mode the first ready
#   prefill worker (registration order); its answer is returned as is (a 404 from an engine without
#   the route included); none ready: 503;
# * /health_generate: the first ready regular worker; in PD mode the first ready prefill worker and
#   the first ready decode worker together (a generation needs both): the first failing answer
#   (prefill first), else the decode worker's; either role without a ready worker: 503.

_PD_TYPES = (WorkerType.PREFILL, WorkerType.DECODE)


def _relayed(handle: WorkerHandle) -> bool:
    return handle.record.kind is WorkerKind.RELAYED


def is_pd_mode(handles: Sequence[WorkerHandle]) -> bool:
    """HTTP PD mode: among the HTTP workers, no regular one and at least one prefill or decode one."""
    types = {handle.record.worker_type for handle in handles if _relayed(handle)}
    return WorkerType.REGULAR not in types and any(kind in types for kind in _PD_TYPES)


def _first_ready(handles: Sequence[WorkerHandle], worker_type: WorkerType) -> WorkerHandle | None:
    for handle in handles:
        if handle.record.status == WorkerStatus.READY and handle.record.worker_type == worker_type and _relayed(handle):
            return handle
    return None


def _targets(snapshot: RegistrySnapshot, path: str, pair: bool) -> tuple[WorkerHandle, ...] | errors.GatewayError:
    """The worker(s) ``path`` goes to: one worker, or with ``pair`` in PD mode a prefill and a decode
    worker; else the error to answer."""
    handles = snapshot.workers
    if not any(_relayed(handle) for handle in handles):
        engines = sorted({handle.record.transport for handle in handles if handle.record.kind is WorkerKind.ENGINE})
        if engines:
            return errors.endpoint_not_supported(path, " and ".join(transport.display_name for transport in engines))
        return errors.no_healthy_workers(None)
    if not is_pd_mode(handles):
        regular = _first_ready(handles, WorkerType.REGULAR)
        return (regular,) if regular is not None else errors.no_healthy_workers(None)
    prefill = _first_ready(handles, WorkerType.PREFILL)
    if not pair:
        return (prefill,) if prefill is not None else errors.no_healthy_workers(None)
    decode = _first_ready(handles, WorkerType.DECODE)
    if prefill is None or decode is None:
        return errors.no_healthy_workers(None)
    return prefill, decode


def _auth(handle: WorkerHandle) -> dict[str, str]:
    key = handle.record.api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _get(handle: WorkerHandle, worker_path: str) -> httpx.Response | errors.GatewayError:
    try:
        return await http_client().get(handle.url + worker_path, headers=_auth(handle), timeout=_FORWARD_TIMEOUT)
    except httpx.TimeoutException:
        return errors.upstream_timeout(_FORWARD_TIMEOUT.read or 0)
    except httpx.HTTPError as exc:
        return errors.upstream_unavailable(type(exc).__name__)


def _forwarder(worker_path: str, pair: bool) -> ASGIApp:
    async def forward(scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_id_for(scope)
        if not await _get_only(scope, send, request_id):
            return
        targets = _targets(data_plane().registry.snapshot, scope["path"], pair)
        if isinstance(targets, errors.GatewayError):
            await send_error(send, targets, request_id)
            return
        answers = await asyncio.gather(*(_get(handle, worker_path) for handle in targets))
        # The first failure (an error of ours, or a worker's non-2xx answer), else the last answer.
        chosen = next((a for a in answers if isinstance(a, errors.GatewayError) or not a.is_success), answers[-1])
        if isinstance(chosen, errors.GatewayError):
            await send_error(send, chosen, request_id)
            return
        headers = [(b"x-request-id", request_id)]
        content_type = chosen.headers.get("content-type")
        if content_type:
            headers.append((b"content-type", content_type.encode("latin-1")))
        await send_response(send, chosen.status_code, chosen.content, headers)

    return forward


get_model_info = _forwarder("/get_model_info", pair=False)
get_server_info = _forwarder("/get_server_info", pair=False)
health_generate = _forwarder("/health_generate", pair=True)


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
    for handle in data_plane().registry.snapshot.workers:
        if handle.record.transport is Transport.HTTP:
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
