"""Worker jobs (spec 3, Worker status): register, update, remove. Sync; run by Celery or on a job thread.

Registration probes the worker until it answers (every --worker-startup-check-interval seconds,
until --worker-startup-timeout-secs): a relayed worker over HTTP (administration/discovery.py); an
engine worker through its transport's connector (inference/upstreams/engine.py ENGINE_CONNECTORS:
for gRPC, each engine's HealthCheck in the order sglang, vllm, trtllm, tokenspeed, mlx unless the
runtime is given), then its model info once, whose answer becomes labels under the operator's own
(administration/engine_facts.py). The engine calls run on a short-lived client of their own
(``asyncio.run`` in the job's thread), closed before the job goes on. An engine over a transport
without a connector is refused. A ZMQ worker is not probed (its engines dial in to the one serving
process that binds its sockets): administration/zmq_workers.py checks and records it, and its
health checks (always on) make it ready.

Every job carries the worker's ``job_generation`` from when it was queued. Each write is a
conditional UPDATE on that generation, so a job for a worker deleted or replaced since it was queued
fails instead of overwriting newer state.

The jobs run inside administration/job_runner.py's wrapper: whatever fails in any step ends the job
as failed through :func:`fail_registration` or :func:`fail_worker_job`. The spec's rules that the
body alone decides were checked at the request (administration/worker_spec.py); a job checks only
what needs the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
import uuid
from typing import Any, Callable, Sequence

import httpx
from django.db import transaction
from django.utils import timezone

from common.db import release_connections
from administration.discovery import (
    Discovery, WorkerRefused, WorkerUnreachable, adiscover_http_worker, discover_http_worker, discover_provider,
    http_server_info, json_answer, probe_headers,
)
from administration.engine_facts import (
    DP_SIZE_LABEL, dp_size_from_server_info, kv_labels_from_server_info, labels_from_model_info,
)
from administration.models import JobState, JobType, Worker, WorkerStatus
from administration.notices import publish_registry_changed, publish_registry_changes
from administration.reachability import Reachability
from administration.worker_clients import WorkerClients, WorkerRequestFailed
from administration.worker_spec import DEFAULT_MODEL_TYPES
from administration.zmq_workers import zmq_discovery, zmq_refusal
from common.config import current_config
from common.http_clients import tls_context
from common.ssrf import SsrfPolicy
from inference.routing.workers import RuntimeType, Transport, WorkerKind, provider_of
from inference.upstreams import ENGINE_CONNECTORS, connect_engine
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.http2 import speaks_http2
from inference.upstreams.registry import UnknownUpstream

__all__ = [
    "run_registration", "run_registrations", "run_update", "run_removal", "RegistrationFailed", "fail_registration",
    "fail_worker_job", "JOB_STORE_PATIENCE_SECS",
]

log = logging.getLogger(__name__)

JOB_STORE_PATIENCE_SECS = 600.0  # how long a job waits out an outage of the store before it is given up (job_runner)
_PROBE_TIMEOUT = httpx.Timeout(5.0, connect=2.0)
_ENGINE_PROBE_TIMEOUT_SECS = 10.0  # one engine probe: runtime detection and the model info together
_FIRST_RETRY_SECS = 0.5
# A job thread probes one worker at a time: one connection, kept for that worker's next request.
_PROBE_LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=1, keepalive_expiry=5.0)


class RegistrationFailed(Exception):
    """Registration cannot succeed (the reason is the message)."""


def _current(worker_id: uuid.UUID | str, generation: int) -> Worker | None:
    try:  # get() leaves out the model's ordering, which .first() compiles into every read
        return Worker.objects.get(pk=worker_id, job_generation=generation)
    except Worker.DoesNotExist:
        return None


def _set_job(
    worker_id: uuid.UUID | str, generation: int, state: str, message: str = "", *, listed: bool | None = None,
    **fields: Any,
) -> bool:
    """Record the job's state (and ``fields``) when it is still the worker's latest job. A listed
    worker's job state shows in GET /workers: the change is published, except for a job's end, whose
    caller publishes once the rest of its work is done. ``listed``: whether the worker is listed,
    when the caller knows (else the store is asked)."""
    updated = Worker.objects.filter(pk=worker_id, job_generation=generation).update(
        job_state=state, job_message=message, job_updated_at=timezone.now(), **fields
    )
    if updated and state != JobState.NONE:
        if listed is None:
            listed = Worker.objects.filter(pk=worker_id, registered=True).exists()
        if listed:
            publish_registry_changed(worker_id)
    return updated == 1


def _check_spec(worker: Worker) -> None:
    """What registration refuses of a spec the request accepted: an engine over a transport the
    gateway has no connector for, zmq_handshake_address on a worker that is not ZMQ, and the ZMQ
    constraints (administration/zmq_workers.py)."""
    if worker.kind is WorkerKind.ENGINE and worker.transport not in ENGINE_CONNECTORS:
        named = f"{worker.transport.display_name} ({worker.url.split('://', 1)[0]}://)"
        raise RegistrationFailed(f"{named} workers are not supported by this gateway yet")
    if worker.transport is not Transport.ZMQ and worker.setting("zmq_handshake_address") is not None:
        raise RegistrationFailed("zmq_handshake_address is for ZMQ (ipc://) workers only")
    if worker.transport is Transport.ZMQ:
        refusal = zmq_refusal(worker, current_config())
        if refusal is not None:
            raise RegistrationFailed(refusal)


def _discover(worker: Worker, generation: int) -> Discovery:
    """Probe until the worker answers, every startup check interval, until the startup timeout."""
    api_key = worker.api_key or _cli_key(worker)
    if worker.kind is WorkerKind.ENGINE:
        transport = worker.transport
        return _probe_until_up(
            worker, generation, lambda: _discover_engine_worker(worker.url, transport, api_key, worker.runtime_type)
        )
    return _probe_until_up(worker, generation, lambda: _probe_http_worker(worker))


def _probe_http_worker(worker: Worker) -> Discovery:
    """One probe of a relayed (HTTP) worker on this thread's client: what it serves and runs, and
    under --dp-aware its data-parallel size. Raises WorkerUnreachable or WorkerRefused."""
    api_key = worker.api_key or _cli_key(worker)
    client = _probe_client()
    found = discover_http_worker(client, worker.url, api_key, worker.runtime_type)
    if current_config().dp_aware:  # the engine's data-parallel size, for a rank per request
        info = http_server_info(client, worker.url, api_key)
        _add_dp_size(found.labels, info, worker.url)
    return found


_probe_clients = threading.local()  # each job thread's client, and the TLS context it was made with


def _probe_client() -> httpx.Client:
    """This job thread's httpx client for registration probes, kept between its jobs (a client per
    job cost its construction each time) and made again when the worker TLS files were reloaded (a
    new context). It keeps one connection alive: the worker being probed, whose discovery asks it
    two to four things in a row. One client per thread rather than one for the process: httpcore
    looks at every pooled connection (a readability check each) twice per request, so a pool
    holding the connections of many workers costs every probe more than it saves."""
    context = tls_context()
    made: tuple[ssl.SSLContext, httpx.Client] | None = getattr(_probe_clients, "made", None)
    if made is None or made[0] is not context or made[1].is_closed:
        if made is not None:
            made[1].close()
        made = (context, httpx.Client(timeout=_PROBE_TIMEOUT, verify=context, trust_env=False, limits=_PROBE_LIMITS))
        _probe_clients.made = made
    return made[1]


def _add_dp_size(labels: dict[str, str], info: dict[str, Any] | None, url: str) -> None:
    """Under --dp-aware: the ``dp_size`` label from the engine's server info, when it reports one
    (without one the worker is routed as a single rank)."""
    size = dp_size_from_server_info(info) if info is not None else None
    if size is None:
        log.info("worker %s reports no dp_size: routed without a data-parallel rank", url)
        return
    labels[DP_SIZE_LABEL] = str(size)


def _discover_provider(worker: Worker) -> Discovery:
    """An external provider's models, asked once with the worker's own key only (never the
    gateway's). A provider is up or not regardless of us, and an external worker is routable at
    once (spec 3): one that does not answer now is registered without a list (it takes any model)."""
    provider = str(worker.labels.get("provider") or "") or provider_of(worker.url)
    try:
        return asyncio.run(
            discover_provider(worker.url, worker.api_key or None, provider, SsrfPolicy.from_config(current_config()))
        )
    except WorkerRefused as exc:
        raise RegistrationFailed(str(exc)) from None
    except WorkerUnreachable as exc:
        log.warning("external worker %s did not list its models (%s); it takes any model", worker.url, exc)
        return Discovery(RuntimeType.EXTERNAL, (), {"provider": provider} if provider else {})


def _probe_until_up(worker: Worker, generation: int, probe: Callable[[], Discovery]) -> Discovery:
    """Run ``probe`` until it answers: again while it raises WorkerUnreachable (each pause doubling up
    to the startup check interval) until the startup timeout, or until the worker is removed or
    replaced; WorkerRefused fails at once."""
    config = current_config()
    deadline = time.monotonic() + config.worker_startup_timeout_secs
    pause = _FIRST_RETRY_SECS
    reachability = Reachability(worker.url, "registration")
    waiting = False
    while True:
        try:
            discovery = probe()
        except WorkerRefused as exc:
            raise RegistrationFailed(str(exc)) from None
        except WorkerUnreachable as exc:
            if not waiting:  # the job is processing (one write with why it waits), before it is logged
                waiting = True
                _set_job(worker.pk, generation, JobState.PROCESSING, listed=worker.registered, last_error=str(exc))
                reachability.failed(str(exc))
            elif reachability.failed(str(exc)):  # the console shows why meanwhile (once per change)
                Worker.objects.filter(pk=worker.pk, job_generation=generation).update(last_error=str(exc))
            if time.monotonic() + pause > deadline:
                raise RegistrationFailed(
                    f"worker did not answer within {config.worker_startup_timeout_secs:g} s ({exc})"
                ) from None
            if _current(worker.pk, generation) is None:
                raise RegistrationFailed("worker was removed or replaced during registration") from None
            release_connections()  # hold no pooled connection while waiting for the worker
            time.sleep(pause)
            pause = min(pause * 2, config.worker_startup_check_interval)
        else:
            reachability.answered()
            return discovery


def _discover_engine_worker(url: str, transport: Transport, api_key: str | None, runtime_type: str) -> Discovery:
    """One engine probe, in this (sync) thread: the runtime (given, or detected by the transport's
    connector) and the engine's model info as labels. Raises WorkerUnreachable while the worker
    cannot be reached, WorkerRefused when it answers but cannot be registered (no engine service, a
    refused key, a runtime without a client over the transport, a failed model info call)."""
    given = None if runtime_type == RuntimeType.UNSPECIFIED else runtime_type
    try:
        runtime, labels = asyncio.run(_aengine_facts(url, api_key, given))
    except UnknownUpstream as exc:
        raise WorkerRefused(f"runtime {given!r} has no {transport.display_name} engine client ({exc})") from None
    except TimeoutError:
        raise WorkerUnreachable(f"no answer from {url} within {_ENGINE_PROBE_TIMEOUT_SECS:g} s") from None
    except UpstreamFailure as exc:
        if exc.kind is FailureKind.BROKEN:
            raise WorkerRefused(str(exc)) from None
        raise WorkerUnreachable(str(exc)) from None
    return Discovery(runtime_type=runtime, model_ids=(), labels=labels)


async def _aengine_facts(url: str, api_key: str | None, runtime: str | None) -> tuple[str, dict[str, str]]:
    """The worker's runtime and model info labels, on a client of its own, closed before returning."""
    async with asyncio.timeout(_ENGINE_PROBE_TIMEOUT_SECS):
        client = await connect_engine(url, runtime, api_key=api_key, detect_timeout=_ENGINE_PROBE_TIMEOUT_SECS)
        try:
            labels = labels_from_model_info(await client.model_info())
            info: dict[str, Any] | None = None
            if current_config().dp_aware or client.runtime in _KV_REPORTING_RUNTIMES:
                try:
                    info = await client.server_info()
                except UpstreamFailure as exc:
                    log.info("worker %s: no server info (%s)", url, exc)
            # The engine-reported KV connector and engine id (prefill/decode: the KV handoff of sequential PD).
            labels.update(kv_labels_from_server_info(info))
            if current_config().dp_aware:  # the engine's data-parallel size, for a rank per request
                _add_dp_size(labels, info, url)
            return client.runtime, labels
        finally:
            await client.close()


_KV_REPORTING_RUNTIMES = frozenset({"vllm"})  # engines whose GetServerInfo names their KV connector


def _cli_key(worker: Worker) -> str | None:
    return current_config().api_key if worker.source == "cli" else None


def _model_id(worker: Worker, discovery: Discovery | None) -> str:
    if worker.model_cards:
        return str(worker.model_cards[0]["id"])
    labels = worker.labels
    for key in ("served_model_name", "model_id", "model_path"):
        if labels.get(key):
            return str(labels[key])
    if discovery is not None and discovery.model_id:
        return discovery.model_id
    return ""


def _discovered_cards(worker: Worker, discovery: Discovery) -> list[dict[str, Any]]:
    """A discovered worker whose model id discovery gave (--model-id-from, a manifest's model_id)
    keeps the model its engine reports as an alias of it (D73); any other worker's cards as given."""
    named, engine = worker.labels.get("served_model_name"), discovery.model_id
    if worker.model_cards or not worker.labels.get("discovery_provider") or not named or engine in (None, named):
        return list(worker.model_cards)
    return [{"id": named, "aliases": [engine], "model_type": list(DEFAULT_MODEL_TYPES)}]


def run_registration(worker_id: str, generation: int) -> None:
    """AddWorker: probe, detect the runtime and models, merge labels; pending until health passes."""
    worker = _current(worker_id, generation)
    if worker is None:
        log.info("registration of %s skipped: superseded", worker_id)
        return
    _check_spec(worker)
    external = worker.kind is WorkerKind.PROVIDER
    if worker.transport is Transport.ZMQ or external:
        # Only this job lists it (registered=True); a newer job changes the generation this write checks.
        _set_job(worker_id, generation, JobState.PROCESSING, listed=worker.registered)
    if worker.transport is Transport.ZMQ:  # not probed: its engines dial in to the serving process
        discovery = zmq_discovery(worker, current_config())
    else:
        # A probed worker's job is written processing only once it waits for the worker
        # (_probe_until_up): one that answers at once goes from queued to done in one write.
        discovery = _discover_provider(worker) if external else _discover(worker, generation)
    fields = _registered_fields(worker, discovery)
    if worker.kind is WorkerKind.RELAYED and worker.transport is Transport.HTTP:
        fields["settings"] = {**worker.settings, HTTP2_USED: _http2_choice(worker)}
    if not _set_job(worker_id, generation, JobState.NONE, **fields):
        log.info("registration of %s finished after the worker changed; result dropped", worker.url)
        return
    _log_registered(worker, fields)
    publish_registry_changed(worker_id)


HTTP2_USED = "http2_used"  # the settings key registration writes its HTTP/2 choice under (D111)
_HTTP2_PROBE_SECS = 5.0


def _http2_wanted(worker: Worker) -> bool | None:
    """What the worker's http_pool.http2 and --upstream-http2 ask: True (HTTP/2 or fail), None (probe,
    HTTP/2 preferred), False (HTTP/1.1)."""
    given = (worker.setting("http_pool") or {}).get("http2")
    if given is not None:
        return bool(given)
    return None if current_config().upstream_http2 else False


def _http2_choice(worker: Worker) -> bool:
    """Whether the relay reaches this relayed HTTP worker over HTTP/2 with prior knowledge (spec 3's
    http_pool.http2; D111): http2 true and a worker that does not speak it fails the registration
    with the reason; unset under --upstream-http2, HTTP/2 when it answers the preface, else
    HTTP/1.1. https:// workers stay on HTTP/1.1 (HTTP/2 over TLS is not done yet)."""
    wanted = _http2_wanted(worker)
    if wanted is False:
        return False
    url = httpx.URL(worker.url)
    if url.scheme != "http":
        if wanted:
            raise RegistrationFailed("http_pool.http2 true: HTTP/2 over TLS (https://) is not supported yet")
        return False
    port = url.port or 80
    try:
        refused = asyncio.run(speaks_http2(url.host, port, _HTTP2_PROBE_SECS))
    except OSError as exc:
        refused = f"its HTTP/2 probe could not connect ({exc})"
    if refused is None:
        return True
    if wanted:
        raise RegistrationFailed(f"http_pool.http2 true but the worker speaks only HTTP/1.1: {refused}")
    log.info("worker %s: HTTP/1.1 (%s)", worker.url, refused)
    return False


def _registered_fields(worker: Worker, discovery: Discovery) -> dict[str, Any]:
    """What a registration that found ``discovery`` writes besides its job state (the worker's
    ``labels`` become the merged ones)."""
    external = worker.kind is WorkerKind.PROVIDER
    labels = {**discovery.labels, **worker.labels}
    worker.labels = labels
    health_off = external or _health_disabled(worker)
    return {
        "runtime_type": discovery.runtime_type,
        # An external provider serves its whole list (model cards are ignored for it, spec 3).
        "model_id": "" if external else _model_id(worker, discovery),
        "provider_models": list(discovery.model_ids) if external else [],
        "labels": labels,
        "registered": True,
        "status": WorkerStatus.READY if health_off else WorkerStatus.PENDING,
        "last_error": "",
        "model_cards": _discovered_cards(worker, discovery),
    }


def _log_registered(worker: Worker, fields: dict[str, Any]) -> None:
    log.info("worker %s registered: runtime %s, model %s, status %s", worker.url, fields["runtime_type"],
             fields["model_id"] or "(any)", fields["status"])


def run_registrations(
    jobs: Sequence[tuple[str, int]],
) -> tuple[list[tuple[str, int]], list[tuple[tuple[str, int], Exception]]]:
    """Many first registrations at once (a fleet from --worker-urls or discovery), each worker as
    :func:`run_registration` registers it, with the work shared: one read of the rows, each relayed
    (HTTP) worker probed once, side by side on one event loop and one client (:func:`_aprobe_together`),
    and the results of those that answered written in one transaction (each still conditional on
    its job generation) with one write of their change-log rows. Returns the jobs to run one by one (:func:`run_registration`:
    engine, ZMQ and provider workers, and a worker that did not answer the first probe, whose job
    then waits for it) and the jobs that failed with what failed them. A store error raises (the
    caller runs them one by one)."""
    rows = {str(worker.pk): worker for worker in Worker.objects.filter(pk__in=[worker_id for worker_id, _ in jobs])}
    alone: list[tuple[str, int]] = []
    failed: list[tuple[tuple[str, int], Exception]] = []
    probed: list[tuple[Worker, int]] = []
    dp_aware = current_config().dp_aware
    for worker_id, generation in jobs:
        worker = rows.get(worker_id)
        if worker is None or worker.job_generation != generation:
            log.info("registration of %s skipped: superseded", worker_id)
            continue
        if (
            dp_aware or worker.transport is Transport.ZMQ or worker.kind is not WorkerKind.RELAYED
            or _http2_wanted(worker) is not False  # its HTTP/2 probe is its own job's
        ):  # fmt: skip
            alone.append((worker_id, generation))
            continue
        try:
            _check_spec(worker)
        except Exception as exc:
            failed.append(((worker_id, generation), exc))
            continue
        probed.append((worker, generation))
    answered: list[tuple[Worker, int, dict[str, Any]]] = []
    found_all = asyncio.run(_aprobe_together([worker for worker, _ in probed])) if probed else []
    for (worker, generation), found in zip(probed, found_all):
        if isinstance(found, Discovery):
            answered.append((worker, generation, _registered_fields(worker, found)))
        elif isinstance(found, WorkerUnreachable):  # its own job waits for it (and writes why)
            alone.append((str(worker.pk), generation))
        elif isinstance(found, WorkerRefused):
            failed.append(((str(worker.pk), generation), RegistrationFailed(str(found))))
        else:
            failed.append(((str(worker.pk), generation), found))
    if answered:
        _finish_registrations(answered)
    return alone, failed


_BATCH_PROBE_TIMEOUT_SECS = 5.0  # one request of a batch's probes (httpx's _PROBE_TIMEOUT for one job)
_BATCH_PROBES_AT_ONCE = 32


async def _aprobe_together(workers: list[Worker]) -> list[Discovery | Exception]:
    """Probe these relayed workers once each, side by side on this loop (at most
    _BATCH_PROBES_AT_ONCE requests at a time), on the health checks' HTTP client
    (administration/worker_clients.py: a fraction of httpx's CPU per request) and the same
    discovery steps as a job's probe: each worker's Discovery, or what its probe raised."""
    clients = WorkerClients(max_concurrent=_BATCH_PROBES_AT_ONCE)

    async def probe(worker: Worker) -> Discovery:
        headers = probe_headers(worker.api_key or _cli_key(worker))

        async def get_json(url: str) -> Any | None:
            try:
                answer = await clients.get(url, headers, _BATCH_PROBE_TIMEOUT_SECS)
            except WorkerRequestFailed as exc:
                raise WorkerUnreachable(str(exc)) from None
            return json_answer(answer.status, answer.json, url, headers)

        return await adiscover_http_worker(get_json, worker.url, worker.runtime_type)

    try:
        found = await asyncio.gather(*(probe(worker) for worker in workers), return_exceptions=True)
    finally:
        await clients.aclose()
    return [item if isinstance(item, (Discovery, Exception)) else RuntimeError(repr(item)) for item in found]


def _finish_registrations(answered: list[tuple[Worker, int, dict[str, Any]]]) -> None:
    """Write the registrations' results in one transaction, each only while its job is still the
    worker's latest (as :func:`_set_job` does for one), then publish their changes together. Workers
    whose results are alike (a fleet of one model) share one UPDATE."""
    now = timezone.now()
    kept: list[tuple[Worker, dict[str, Any]]] = []
    with transaction.atomic():
        current = dict(
            Worker.objects.select_for_update()
            .filter(pk__in=[worker.pk for worker, _, _ in answered])
            .values_list("pk", "job_generation")
        )
        alike: dict[str, tuple[dict[str, Any], list[Any]]] = {}
        for worker, generation, fields in answered:
            if current.get(worker.pk) != generation:
                log.info("registration of %s finished after the worker changed; result dropped", worker.url)
                continue
            key = json.dumps(fields, sort_keys=True, default=str)
            alike.setdefault(key, (fields, []))[1].append(worker.pk)
            kept.append((worker, fields))
        for fields, worker_ids in alike.values():
            Worker.objects.filter(pk__in=worker_ids).update(
                job_state=JobState.NONE, job_message="", job_updated_at=now, **fields
            )
    for worker, fields in kept:
        _log_registered(worker, fields)
    publish_registry_changes([worker.pk for worker, _ in kept])


def _health_disabled(worker: Worker) -> bool:
    if worker.transport is Transport.ZMQ:  # spec 3: ZMQ health checks stay on
        return False
    given = worker.setting("health", {}).get("disable_health_check")
    return bool(current_config().disable_health_check if given is None else given)


def fail_registration(worker_id: uuid.UUID | str, generation: int, message: str) -> None:
    """End a registration as failed (whatever failed in it): a first registration releases the
    reserved id and its URL (GET answers 404; the reason is in the log); a registered worker's keeps
    the worker with a failed job_status. Nothing when a newer job has replaced this one."""
    worker = _current(worker_id, generation)
    if worker is None:
        log.info("registration of %s failed after the worker changed (%s); result dropped", worker_id, message)
        return
    log.error("registration of worker %s failed: %s", worker.url, message)
    if not worker.registered:
        Worker.objects.filter(pk=worker.pk, job_generation=generation).delete()
        publish_registry_changed(worker.pk)
    else:
        _set_job(worker.pk, generation, JobState.FAILED, message, last_error=message)  # publishes the change


def fail_worker_job(worker_id: uuid.UUID | str, generation: int, message: str) -> None:
    """End an update or a removal as failed: the worker stays, with a failed job_status."""
    log.error("job of worker %s failed: %s", worker_id, message)
    _set_job(worker_id, generation, JobState.FAILED, message)


def run_update(worker_id: str, generation: int, changes: dict[str, Any]) -> None:
    """UpdateWorker (PATCH): apply the changed fields in place."""
    worker = _current(worker_id, generation)
    if worker is None:
        return
    _set_job(worker_id, generation, JobState.PROCESSING)
    fields = _update_fields(worker, changes)
    if _set_job(worker_id, generation, JobState.NONE, **fields):
        publish_registry_changed(worker_id)


_COLUMN_FIELDS = ("runtime_type", "worker_type", "connection_mode", "priority", "cost")
_SETTING_FIELDS = ("dp_size", "zmq_handshake_address", "bootstrap_port", "kv_connector", "kv_engine_id")
_BLOCKS = ("health", "http_pool", "resilience")


def _update_fields(worker: Worker, changes: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    settings = dict(worker.settings)
    for key, value in changes.items():
        if key in _COLUMN_FIELDS:
            fields[key] = value
        elif key == "api_key":
            fields["api_key"] = value or ""
        elif key == "labels":
            fields["labels"] = {**worker.labels, **value}
        elif key == "models":
            fields["model_cards"] = list(value)
            if value:
                fields["model_id"] = value[0]["id"]
        elif key in _SETTING_FIELDS:
            settings[key] = value
        elif key in _BLOCKS:
            settings[key] = {**settings.get(key, {}), **value}
    fields["settings"] = settings
    return fields


def run_removal(worker_id: str, generation: int) -> None:
    """RemoveWorker: a ready worker drains for drain_settle_secs first; any other status goes at once."""
    worker = _current(worker_id, generation)
    if worker is None:
        return
    _set_job(worker_id, generation, JobState.PROCESSING)
    if worker.status == WorkerStatus.READY and worker.registered:
        settle = worker.setting("health", {}).get("drain_settle_secs")
        settle = current_config().drain_settle_secs if settle is None else settle
        if settle > 0:
            Worker.objects.filter(pk=worker_id, job_generation=generation).update(status=WorkerStatus.DRAINING)
            publish_registry_changed(worker_id)
            time.sleep(settle)
    deleted, _ = Worker.objects.filter(pk=worker_id, job_generation=generation).delete()
    if deleted:
        log.info("worker %s removed", worker.url)
    publish_registry_changed(worker_id)


JOB_TYPES = {"register": JobType.ADD, "update": JobType.UPDATE, "remove": JobType.REMOVE}
