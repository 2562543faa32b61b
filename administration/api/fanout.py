"""Control-plane fleet routes (spec 3, Cache and load; Other control-plane routes), admin only:

* ``POST /flush_cache``: every registered HTTP and gRPC worker drops its KV prefix cache, in parallel;
* ``GET /get_loads``: deprecated alias of the public ``GET /loads``;
* ``POST /start_profile``, ``POST /stop_profile``: every worker, or the one whose URL the body names.

Native async Django views (the fan-outs await httpx and gRPC, up to 45 s per worker): each one
authenticates through :mod:`administration.control_auth`, parses its input, calls one fan-out
function and renders the result. The fan-out functions take the registry's worker handles and an
httpx client.

HTTP workers (relayed ones and external providers) get the POST; engine workers the engine's
FlushCache, StartProfile or StopProfile command through their engine client, single attempt (ZMQ
engines are skipped by /flush_cache, as the spec says). Under ASGI the views run on the serving loop
(the loop of the registry sync, :func:`~administration.registry_sync.on_serving_loop`), where the
data plane's shared engine client of each worker is used; a view run on a loop of its own (a sync
caller) opens a short-lived client per worker through its transport's connector and closes it
afterwards, as a connection belongs to the loop that opened it. A runtime without the command (or
without an engine client) is reported under ``failed`` with the reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Sequence

import httpx
import orjson
from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from administration.api.errors import ErrorType, error_body
from administration.api.methods import control_route
from administration.control_auth import ControlPlaneDenied, control_plane_auth
from administration.registry_sync import on_serving_loop
from common.http_clients import http_client
from inference.dataplane import data_plane
from inference.routing.load_report import loads_report
from inference.routing.registry import REGISTRY
from inference.routing.workers import RuntimeType, Transport, WorkerHandle, WorkerKind
from inference.upstreams import connect_engine
from inference.upstreams.engine import CommandResult, EngineClient, ProfileOptions
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.registry import UnknownUpstream

__all__ = [
    "FanOut",
    "PROFILE_FIELDS",
    "FLUSH_TIMEOUT_SECS",
    "aflush_cache",
    "aprofile",
    "flush_cache_view",
    "get_loads_view",
    "start_profile_view",
    "stop_profile_view",
]

FLUSH_TIMEOUT_SECS = 45.0
PROFILE_TIMEOUT_SECS = 60.0
PROFILE_FIELDS = (
    "output_dir",
    "start_step",
    "num_steps",
    "activities",
    "with_stack",
    "record_shapes",
    "profile_by_stage",
)
_ERROR_TEXT_LIMIT = 300


@dataclass(slots=True)
class FanOut:
    """Which workers answered a fan-out and which failed (with the reason)."""

    successful: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)


async def _apost(client: httpx.AsyncClient, handle: WorkerHandle, path: str, body: Any, timeout: float) -> str | None:
    """POST to one worker with its key; None on a 2xx answer, else the reason."""
    headers = {"Authorization": f"Bearer {handle.record.api_key}"} if handle.record.api_key else {}
    try:
        response = await client.post(handle.url + path, json=body, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return f"timed out after {timeout:g} seconds"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if response.is_success:
        return None
    return f"HTTP {response.status_code}: {response.text[:_ERROR_TEXT_LIMIT]}"


_Command = Callable[[EngineClient], Awaitable[CommandResult]]


async def _acommand(handle: WorkerHandle, rpc: str, command: _Command, timeout: float) -> str | None:
    """Run one control command on an engine worker (single attempt): through the data plane's shared
    engine client on the serving loop, else on a short-lived client closed afterwards. None when the
    engine reports success, else the reason."""
    record = handle.record
    runtime = None if record.runtime_type == RuntimeType.UNSPECIFIED else record.runtime_type
    try:
        async with asyncio.timeout(timeout):
            if on_serving_loop():
                result = await command(data_plane().engines.client(record))
            else:
                client = await connect_engine(record.url, runtime, api_key=record.api_key)
                try:
                    result = await command(client)
                finally:
                    await client.close()
    except TimeoutError:
        return f"timed out after {timeout:g} seconds"
    except UnknownUpstream:
        over = record.transport.display_name
        return f"{rpc} is not supported: the {record.runtime_type} runtime has no {over} engine client"
    except UpstreamFailure as exc:
        if "UNIMPLEMENTED" in exc.detail:
            return f"{rpc} is not supported by the {record.runtime_type} runtime ({exc.detail})"
        return exc.detail
    if result.success:
        return None
    return f"{rpc} failed: {result.message[:_ERROR_TEXT_LIMIT]}" if result.message else f"{rpc} failed"


async def _afan_out(handles: Sequence[WorkerHandle], calls: Iterable[Awaitable[str | None]]) -> FanOut:
    """Await one call per handle, in parallel; each answers None on success, else the reason."""
    outcome = FanOut()
    reasons = await asyncio.gather(*calls)
    for handle, reason in zip(handles, reasons):
        if reason is None:
            outcome.successful.append(handle.url)
        else:
            outcome.failed.append({"worker": handle.url, "error": reason})
    return outcome


async def aflush_cache(client: httpx.AsyncClient, workers: Sequence[WorkerHandle]) -> tuple[int, dict[str, Any]]:
    """POST {url}/flush_cache to every HTTP worker (relayed, and external providers too) and
    FlushCache to every engine worker, in parallel (45 s each); ZMQ engines are skipped (and
    counted: the spec names that transport). 200 when every called worker succeeds (or none was
    called), 206 otherwise."""
    http = [h for h in workers if h.record.kind is not WorkerKind.ENGINE]
    engines = [h for h in workers if h.record.kind is WorkerKind.ENGINE]
    zmq = [h for h in engines if h.record.transport is Transport.ZMQ]
    grpc = [h for h in engines if h.record.transport is not Transport.ZMQ]
    outcome = await _afan_out(
        [*http, *grpc],
        [
            *(_apost(client, h, "/flush_cache", None, FLUSH_TIMEOUT_SECS) for h in http),
            *(_acommand(h, "FlushCache", lambda engine: engine.flush_cache(), FLUSH_TIMEOUT_SECS) for h in grpc),
        ],
    )
    body: dict[str, Any] = {
        "status": "partial_success" if outcome.failed else "success",
        "message": "",
        "workers_flushed": len(outcome.successful),
        "total_http_workers": len(http),
        "total_grpc_workers": len(grpc),
        "total_zmq_workers_skipped": len(zmq),
        "total_workers": len(workers),
    }
    called = len(http) + len(grpc)
    if outcome.failed:
        body["message"] = f"Cache flush failed on {len(outcome.failed)} of {called} workers"
        body["successful"] = outcome.successful
        body["failed"] = outcome.failed
        return 206, body
    body["message"] = f"Cache flushed on {len(outcome.successful)} workers" if called else "No workers to flush"
    return 200, body


def _profile_options(body: dict[str, Any]) -> ProfileOptions:
    """/start_profile's options as the engine clients take them; ValueError for a value of the wrong
    type (an HTTP worker gets the body as it is and judges it itself)."""

    def typed(key: str, kind: type | tuple[type, ...]) -> Any:
        value = body.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise ValueError(f"{key} has the wrong type")
        return value

    activities = body.get("activities") or []
    if not isinstance(activities, list) or not all(isinstance(item, str) for item in activities):
        raise ValueError("activities must be a list of strings")
    return ProfileOptions(
        output_dir=typed("output_dir", str),
        start_step=typed("start_step", int),
        num_steps=typed("num_steps", int),
        activities=tuple(activities),
        with_stack=typed("with_stack", bool),
        record_shapes=typed("record_shapes", bool),
        profile_by_stage=bool(typed("profile_by_stage", bool)),
    )


def _profile_command(action: str, body: dict[str, Any]) -> tuple[str, _Command] | str:
    """The RPC name and call of a profiling action, or why there is none (options of the wrong type)."""
    if action != "start_profile":
        return "StopProfile", lambda engine: engine.stop_profile()
    try:
        options = _profile_options(body)
    except ValueError as exc:
        return f"invalid profiling options: {exc}"
    return "StartProfile", lambda engine: engine.start_profile(options)


async def _afailed(reason: str) -> str:
    return reason


async def aprofile(
    client: httpx.AsyncClient, workers: Sequence[WorkerHandle], action: str, options: dict[str, Any]
) -> tuple[int, dict[str, Any]] | None:
    """POST {url}/start_profile or /stop_profile to the targeted HTTP workers and StartProfile or
    StopProfile to the targeted engine workers, in parallel (all, or the one whose URL
    ``options["url"]`` names); an engine whose client has no profiling (ZMQ, three gRPC runtimes) is
    reported failed. None when no worker matches; else 200 or 206."""
    wanted = options.get("url")
    targets = [h for h in workers if wanted is None or h.url == str(wanted).rstrip("/")]
    if not targets:
        return None
    body = {key: options[key] for key in PROFILE_FIELDS if key in options} if action == "start_profile" else {}
    engine_command = _profile_command(action, body)
    calls: list[Awaitable[str | None]] = []
    for handle in targets:
        if handle.record.kind is not WorkerKind.ENGINE:
            calls.append(_apost(client, handle, f"/{action}", body or None, PROFILE_TIMEOUT_SECS))
        elif isinstance(engine_command, str):
            calls.append(_afailed(engine_command))
        else:
            calls.append(_acommand(handle, *engine_command, PROFILE_TIMEOUT_SECS))
    outcome = await _afan_out(targets, calls)
    verb = "started" if action == "start_profile" else "stopped"
    result: dict[str, Any] = {"successful": outcome.successful}
    if outcome.failed:
        result["status"] = "partial_success"
        result["message"] = f"Profiling {verb} on {len(outcome.successful)} of {len(targets)} workers"
        result["failed"] = outcome.failed
        return 206, result
    result["status"] = "success"
    result["message"] = f"Profiling {verb} on {len(targets)} workers"
    return 200, result


# --- views ------------------------------------------------------------------------------------------


async def _denied(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may use the control plane; else the 401 / 403 answer."""
    auth = control_plane_auth()
    try:
        principal = await sync_to_async(auth.authenticate)(request.headers.get("Authorization"))
        auth.authorize(principal)
    except ControlPlaneDenied as denied:
        unauthorized = denied.status == 401
        error_type = ErrorType.UNAUTHORIZED if unauthorized else ErrorType.FORBIDDEN
        response = JsonResponse(error_body(denied.message, error_type), status=denied.status)
        if unauthorized:
            response["WWW-Authenticate"] = "Bearer"
        return response
    return None


def _json_options(request: HttpRequest) -> dict[str, Any] | HttpResponse:
    if not request.body.strip():
        return {}
    try:
        value = orjson.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        return JsonResponse(error_body(f"Request body is not valid JSON: {exc}", ErrorType.BAD_REQUEST), status=400)
    if not isinstance(value, dict):
        return JsonResponse(error_body("Request body must be a JSON object", ErrorType.BAD_REQUEST), status=400)
    return value


@control_route("POST")
async def flush_cache_view(request: HttpRequest) -> HttpResponse:
    if (denied := await _denied(request)) is not None:
        return denied
    status, body = await aflush_cache(http_client(), REGISTRY.snapshot.workers)
    return JsonResponse(body, status=status)


@control_route("GET")
async def get_loads_view(request: HttpRequest) -> HttpResponse:
    if (denied := await _denied(request)) is not None:
        return denied
    return JsonResponse(loads_report(REGISTRY, request.GET.get("model") or None))


async def _profile(request: HttpRequest, action: str) -> HttpResponse:
    if (denied := await _denied(request)) is not None:
        return denied
    options = _json_options(request)
    if isinstance(options, HttpResponse):
        return options
    result = await aprofile(http_client(), REGISTRY.snapshot.workers, action, options)
    if result is None:
        target = f"with url {options['url']}" if options.get("url") else "registered"
        return JsonResponse(error_body(f"No worker {target}", ErrorType.NOT_FOUND), status=404)
    status, body = result
    return JsonResponse(body, status=status)


@control_route("POST")
async def start_profile_view(request: HttpRequest) -> HttpResponse:
    return await _profile(request, "start_profile")


@control_route("POST")
async def stop_profile_view(request: HttpRequest) -> HttpResponse:
    return await _profile(request, "stop_profile")
