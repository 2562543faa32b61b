"""Worker registry domain functions (sync, ORM). The admin API, the console, the jobs and the
manage.py commands call these; none of them decides anything on its own."""

from __future__ import annotations

import logging
import uuid
from functools import partial
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable, Sequence

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from administration.jobs import enqueue
from administration.models import JobState, JobType, Worker, WorkerSource, WorkerStatus, WorkerType
from administration.notices import publish_registry_changed
from administration.engine_facts import dp_ranks, engine_spec
from administration.registration import HTTP2_USED, JOB_STORE_PATIENCE_SECS
from administration.worker_spec import SpecRuleError, WorkerSpec, parse_worker_spec
from common.config import PROVIDER_BACKENDS, GatewayConfig, current_config
from common.worker_metrics import http2_of
from inference.routing.breaker import DEFAULT_CAPACITY, DEFAULT_RETRYABLE, Resilience
from inference.routing.pd import pairing_key
from inference.routing.workers import HttpPool, PdTraits, RuntimeType, Transport, WorkerKind, WorkerRecord, kind_of
from inference.upstreams.zmq.addresses import ZmqAddressError, zmq_addresses

__all__ = [
    "WorkerError",
    "WorkerNotFound",
    "WorkerAlreadyExists",
    "WorkerCreateInProgress",
    "JobQueueUnavailable",
    "FAILED_JOB_RETENTION",
    "JobStatus",
    "job_of",
    "create_worker",
    "create_workers",
    "update_worker",
    "replace_worker",
    "remove_worker",
    "reregister_worker",
    "get_worker",
    "find_worker",
    "drain_worker",
    "job_status",
    "spec_fields",
    "worker_fields",
    "pd_pairing_of",
    "pd_traits",
    "kv_field",
    "handshake_address_of",
    "list_workers",
    "registering_workers",
    "every_worker",
    "sync_cli_workers",
    "worker_records",
    "resilience_of",
]

FAILED_JOB_RETENTION = timedelta(minutes=5)
ABANDONED_SLACK = timedelta(minutes=1)

log = logging.getLogger(__name__)


class WorkerError(Exception):
    code = "INTERNAL_SERVER_ERROR"
    status = 500


class WorkerNotFound(WorkerError):
    code, status = "WORKER_NOT_FOUND", 404


class WorkerAlreadyExists(WorkerError):
    code, status = "WORKER_ALREADY_EXISTS", 409


class WorkerCreateInProgress(WorkerError):
    code, status = "WORKER_CREATE_IN_PROGRESS", 409


class JobQueueUnavailable(WorkerError):
    code, status = "INTERNAL_SERVER_ERROR", 500


def _columns(spec: WorkerSpec) -> dict[str, Any]:
    settings = {
        key: value
        for key, value in asdict(spec).items()
        if key in ("dp_size", "zmq_handshake_address", "bootstrap_port", "kv_connector", "kv_engine_id")
        and value is not None
    }
    for block in ("health", "overload", "http_pool", "resilience"):
        value = getattr(spec, block)
        if value:
            settings[block] = dict(value)
    return {
        "runtime_type": spec.runtime_type,
        "worker_type": spec.worker_type,
        "connection_mode": spec.connection_mode,
        "api_key": spec.api_key or "",
        "model_cards": list(spec.models),
        "model_id": spec.models[0]["id"] if spec.models else "",
        "labels": dict(spec.labels),
        "priority": spec.priority,
        "cost": spec.cost,
        "settings": settings,
    }


def _queue(name: str, worker: Worker, *args: Any, local: bool = False) -> None:
    try:
        enqueue(name, str(worker.pk), worker.job_generation, *args, local=local)
    except Exception as exc:  # broker down or refusing: the spec's 500
        raise JobQueueUnavailable(f"job queue unavailable: {type(exc).__name__}") from None


def _abandoned(worker: Worker) -> bool:
    """A first registration whose job cannot still be running (its process died, the broker lost
    it, it gave up on the store): longer since the job last moved than discovery may take
    (--worker-startup-timeout-secs) plus a store outage the job may wait out. Its row would
    otherwise keep the URL from ever being registered again."""
    if worker.registered or worker.job_updated_at is None:
        return False
    config = current_config()
    limit = timedelta(seconds=config.worker_startup_timeout_secs + JOB_STORE_PATIENCE_SECS) + ABANDONED_SLACK
    return timezone.now() - worker.job_updated_at > limit


def _stored_url(url: str) -> Worker | None:
    """The worker stored for ``url``, locked (get() leaves out the model's ordering, which .first()
    compiles into every read: a registration's reads are a good part of its cost at 1,000 workers)."""
    try:
        return Worker.objects.select_for_update().get(url=url)
    except Worker.DoesNotExist:
        return None


def _new_row(spec: WorkerSpec, source: str) -> Worker:
    """The row of a worker whose first registration is queued (not saved yet)."""
    return Worker(
        url=spec.url,
        source=source,
        status=WorkerStatus.PENDING,
        registered=False,
        job_type=JobType.ADD,
        job_state=JobState.PENDING,
        job_updated_at=timezone.now(),
        job_generation=1,
        **_columns(spec),
    )


def create_worker(spec: WorkerSpec, *, source: str = WorkerSource.API) -> Worker:
    """Reserve an id for ``spec.url`` and queue its registration (POST /workers).

    The row is inserted at once: the URL's unique key refuses it when the URL is stored, and only
    then is the stored row read (a first registration pays one write, no read: at 1,000 workers
    the read was a good part of the POST)."""
    worker = _new_row(spec, source)
    try:
        with transaction.atomic():  # a savepoint inside a caller's transaction
            worker.save(force_insert=True)
            _queue("register", worker, local=source == WorkerSource.CLI)
        return worker
    except IntegrityError:  # the URL is stored: refused, unless its first registration was abandoned
        pass
    with transaction.atomic():
        existing = _stored_url(spec.url)
        if existing is not None and _abandoned(existing):
            log.warning("registration of %s (id %s) was abandoned by its job; registering the url anew",
                        existing.url, existing.pk)
            existing.delete()  # never listed (a first registration): no other process knew it
            existing = None
        if existing is not None:
            if existing.registered:
                raise WorkerAlreadyExists(f"Worker {spec.url} already exists with id {existing.pk}")
            raise WorkerCreateInProgress(
                f"Worker {spec.url} is being registered; poll /workers/{existing.pk}"
            )
        worker = _new_row(spec, source)
        try:
            with transaction.atomic():
                worker.save(force_insert=True)
        except IntegrityError:  # a concurrent POST for the same URL won the race
            raise WorkerCreateInProgress(f"Worker {spec.url} is being registered") from None
        _queue("register", worker, local=source == WorkerSource.CLI)
    return worker


def _locked(worker_id: uuid.UUID) -> Worker:
    worker = Worker.objects.select_for_update().filter(pk=worker_id).first()
    if worker is None:
        raise WorkerNotFound(f"Worker {worker_id} not found")
    return worker


def _start_job(worker: Worker, job_type: str, **fields: Any) -> Worker:
    Worker.objects.filter(pk=worker.pk).update(
        job_type=job_type,
        job_state=JobState.PENDING,
        job_message="",
        job_updated_at=timezone.now(),
        job_generation=F("job_generation") + 1,
        **fields,
    )
    worker.refresh_from_db()
    if worker.registered:  # listed: GET /workers shows the job
        transaction.on_commit(partial(publish_registry_changed, worker.pk))
    return worker


def update_worker(worker_id: uuid.UUID, changes: dict[str, Any]) -> Worker:
    """PATCH: queue an in-place update of the fields parse_worker_patch kept (PATCH_FIELDS)."""
    with transaction.atomic():
        worker = _locked(worker_id)
        worker = _start_job(worker, JobType.UPDATE)
        _queue("update", worker, changes)
    return worker


def replace_worker(worker_id: uuid.UUID, spec: WorkerSpec) -> Worker:
    """PUT: replace the whole spec (defaults for what it omits) and re-run registration. Refused
    under --dp-aware (the reference's rule: a data-parallel worker is replaced by DELETE + POST)."""
    with transaction.atomic():
        worker = _locked(worker_id)
        if current_config().dp_aware:  # spec 3: refused 400 under --dp-aware
            raise SpecRuleError(
                f"Worker '{worker.url}' belongs to a data-parallel group. PUT is not supported for "
                "data-parallel workers. Use DELETE + POST instead."
            )
        if spec.url != worker.url:
            raise SpecRuleError("PUT cannot change the url of a worker")
        worker = _start_job(worker, JobType.ADD, **_columns(spec))
        _queue("register", worker)
    return worker


def reregister_worker(worker_id: uuid.UUID) -> Worker:
    """Run the registration job again with the stored spec (probe, detect, then health checks)."""
    with transaction.atomic():
        worker = _locked(worker_id)
        worker = _start_job(worker, JobType.ADD, status=WorkerStatus.PENDING)
        _queue("register", worker, local=worker.source == WorkerSource.CLI)
    return worker


def remove_worker(worker_id: uuid.UUID) -> Worker:
    """DELETE: drain (a ready worker) and remove."""
    with transaction.atomic():
        worker = _locked(worker_id)
        worker = _start_job(worker, JobType.REMOVE)
        _queue("remove", worker, local=worker.source == WorkerSource.CLI)
    return worker


def drain_worker(worker_id: uuid.UUID) -> Worker:
    """Stop sending new requests to a worker (in-flight ones finish); it stays registered."""
    worker = get_worker(worker_id)
    if worker.status != WorkerStatus.DRAINING:
        Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.DRAINING)
        worker.refresh_from_db()
        publish_registry_changed(worker.pk)
    return worker


def find_worker(ref: str) -> Worker:
    """A worker by id or by URL (commands and the console accept either)."""
    try:
        return get_worker(uuid.UUID(ref))
    except ValueError:
        worker = Worker.objects.filter(url=ref.rstrip("/")).first()
        if worker is None:
            raise WorkerNotFound(f"No worker with id or url {ref}") from None
        return worker


def get_worker(worker_id: uuid.UUID) -> Worker:
    worker = Worker.objects.filter(pk=worker_id).first()
    if worker is None:
        raise WorkerNotFound(f"Worker {worker_id} not found")
    return worker


def _serving(workers: Iterable[Worker], model: str | None) -> list[Worker]:
    """``workers``; with ``model``, those serving it (id or alias) and those with no model list."""
    return [w for w in workers if not model or not w.model_ids() or model in w.model_ids()]


def list_workers(model: str | None = None) -> list[Worker]:
    """Registered workers (GET /workers' list); with ``model``, those that may serve it."""
    return _serving(Worker.objects.listed(), model)


def registering_workers(model: str | None = None) -> list[Worker]:
    """Workers whose first registration runs (a worker not up yet is probed until it answers): not
    in GET /workers' list (spec 3), shown beside it; with ``model``, those that may serve it."""
    return _serving(Worker.objects.registering(), model)


def every_worker(model: str | None = None) -> list[Worker]:
    """Every stored worker, registering ones included, in registration order (list_workers, the console)."""
    return _serving(Worker.objects.all(), model)


def spec_fields(worker: Worker) -> dict[str, Any]:
    """The stored spec's top-level fields as the API shows them (never api_key)."""
    return {
        "url": worker.url,
        "runtime_type": worker.runtime_type,
        "worker_type": worker.worker_type,
        "connection_mode": worker.transport.value,
        "models": worker.model_cards,
        "labels": worker.labels,
        "priority": worker.priority,
        "cost": worker.cost,
    }


_SETTING_KEYS = ("dp_size", "zmq_handshake_address", "bootstrap_port", "kv_connector", "kv_engine_id", "overload")
_KV_FIELDS = ("kv_connector", "kv_engine_id")


def pd_pairing_of(worker: Worker) -> str | None:
    """The pd_pairing the API shows for a prefill or decode worker (None for the others): the key
    PD routing pairs by (inference/routing/pd.py), from the stored row."""
    traits = pd_traits(worker)
    if traits is None or worker.worker_type == WorkerType.ENCODE:
        return None
    return pairing_key(worker.runtime_type, worker.transport.value, traits)


def kv_field(worker: Worker, name: str) -> str | None:
    """kv_connector or kv_engine_id: the spec field, else the same-named label (spec 3: the label
    moves into the field; a non-empty field wins)."""
    value = worker.setting(name) or worker.labels.get(name)
    return str(value) if value else None


def handshake_address_of(worker: Worker) -> str | None:
    """A ZMQ worker's handshake address: the spec's zmq_handshake_address, else the one derived from
    its ipc:// path (tcp://127.0.0.1:<20000-29999>); None for other workers or an unusable value."""
    given = worker.setting("zmq_handshake_address")
    if worker.transport is not Transport.ZMQ:
        return str(given) if given is not None else None
    try:
        return zmq_addresses(worker.url, given).handshake
    except ZmqAddressError:
        return str(given) if given is not None else None


def http2_chosen(worker: Worker, kind: WorkerKind | None = None) -> bool:
    """Whether the HTTP relay reaches this worker over HTTP/2 with prior knowledge: a relayed worker
    whose registration chose it (D111; external providers stay on HTTP/1.1). ``kind``: the worker's,
    when the caller has it already."""
    return bool(worker.setting(HTTP2_USED)) and (kind or worker.kind) is WorkerKind.RELAYED


def worker_fields(worker: Worker, config: GatewayConfig) -> dict[str, Any]:
    """The worker as the API shows it, but for its live state (load, engine load, job status): the
    spec's fields (never api_key), its status and settings. Built from the stored row, so the fleet
    loop keeps it beside the registry and GET /workers lists from memory."""
    body: dict[str, Any] = {
        "id": str(worker.pk),
        **spec_fields(worker),
        "is_healthy": worker.status == WorkerStatus.READY,
        "status": worker.status,
        # The gauge's fact (gw_worker_http2): gRPC is HTTP/2; an HTTP worker as registration chose.
        "http2": bool(http2_of(worker.transport, http2_chosen(worker))),
        "max_connection_attempts": config.retry_max_retries + 1,
    }
    if worker.model_id:
        body["model_id"] = worker.model_id
    for key in _SETTING_KEYS:
        value = worker.setting(key)
        if value is not None:
            body[key] = value
    for key in _KV_FIELDS:
        kv = kv_field(worker, key)
        if kv is not None:
            body[key] = kv
    address = handshake_address_of(worker)
    if address is not None:
        body["zmq_handshake_address"] = address
    pairing = pd_pairing_of(worker)
    if pairing is not None:
        body["pd_pairing"] = pairing
    return body


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A worker's job as GET answers it, and until when a failed one is still shown."""

    body: dict[str, Any]
    shown_until: datetime | None = None

    def current(self, now: datetime | None = None) -> dict[str, Any] | None:
        if self.shown_until is not None and (now or timezone.now()) > self.shown_until:
            return None
        return self.body


def job_of(worker: Worker) -> JobStatus | None:
    """The worker's job while it is queued or running, or failed (shown for about five minutes)."""
    if not worker.job_state or worker.job_updated_at is None:
        return None
    shown_until = worker.job_updated_at + FAILED_JOB_RETENTION if worker.job_state == JobState.FAILED else None
    body = {
        "job_type": worker.job_type,
        "worker_url": worker.url,
        "status": worker.job_state,
        "message": worker.job_message or None,
        "timestamp": int(worker.job_updated_at.timestamp()),
    }
    return JobStatus(body, shown_until)


def job_status(worker: Worker) -> dict[str, Any] | None:
    """The spec's job_status while a job is queued or running, or for about five minutes after it failed."""
    job = job_of(worker)
    return job.current() if job is not None else None


def backend_runtime(backend: str) -> str:
    """The runtime type --backend gives command-line workers (auto: detected at registration)."""
    if backend in PROVIDER_BACKENDS:
        return RuntimeType.EXTERNAL
    return RuntimeType.UNSPECIFIED if backend == "auto" else backend


def cli_pd_workers(config: GatewayConfig) -> tuple[tuple[str, str, int | None], ...]:
    """The --prefill and --decode workers of --pd-disaggregation: (url, worker type, bootstrap port)."""
    if not config.pd_disaggregation:
        return ()
    return (
        *((url, str(WorkerType.PREFILL), port) for url, port in config.prefill_urls),
        *((url, str(WorkerType.DECODE), None) for url in config.decode_urls),
    )


def sync_cli_workers(
    urls: Sequence[str], backend: str = "auto", pd: Sequence[tuple[str, str, int | None]] = ()
) -> list[Worker]:
    """Make the stored command-line workers match ``--worker-urls`` (and the --prefill and --decode
    workers of --pd-disaggregation, ``pd``: each with its worker type and bootstrap port).

    Several gateway processes may share one store: a gateway started without ``--worker-urls`` joins
    the stored fleet as it is and changes nothing; one started with the flag makes the command-line
    workers exactly that list (others are removed). A listed worker that is already ready keeps
    serving (the other gateways route to it meanwhile); one that is not is registered anew. Workers
    registered through the admin API are left alone, even when a flag names the same URL.
    """
    entries: dict[str, dict[str, Any]] = {url: {} for url in urls}
    for url, worker_type, port in pd:
        entries[url] = {"worker_type": worker_type, **({"bootstrap_port": port} if port is not None else {})}
    if not entries:
        return list(Worker.objects.from_cli())
    with transaction.atomic():
        removed, _ = Worker.objects.from_cli().exclude(url__in=list(entries)).delete()
        unlisted = False
        # One read for every stored row of these URLs and one write for the new ones (at 1,000
        # workers, a read and a write per URL were most of the start-up).
        stored = {worker.url: worker for worker in Worker.objects.select_for_update().filter(url__in=list(entries))}
        specs: list[WorkerSpec] = []
        for url, extra in entries.items():
            existing = stored.get(url)
            if existing is None:
                given: dict[str, Any] = {"url": url, "runtime_type": backend_runtime(backend), **extra}
                if backend in PROVIDER_BACKENDS:  # the provider, whatever host its API is on
                    given["labels"] = {"provider": backend}
                specs.append(parse_worker_spec(given))
            elif existing.source == WorkerSource.CLI and existing.status != WorkerStatus.READY:
                stored[url] = _start_job(existing, JobType.ADD, status=WorkerStatus.PENDING, registered=False)
                _queue("register", stored[url], local=True)
                unlisted = unlisted or existing.registered
        stored.update((worker.url, worker) for worker in _create_together(specs, WorkerSource.CLI))
        workers = [stored[url] for url in entries]
    if removed or unlisted:  # other processes stop routing to them (a full reload: it may be many)
        publish_registry_changed()
    return workers


def create_workers(specs: Sequence[WorkerSpec], *, source: str = WorkerSource.API) -> list[Worker | WorkerError]:
    """Reserve ids for many URLs and queue their registrations, as create_worker does for each, with
    one store write for them all (discovery finding a fleet). Each place of the answer is the
    worker, or the error create_worker gives for that spec alone: a URL stored already (or
    meanwhile, by another gateway host) undoes the shared write, and the specs are then created one
    by one, so only that URL is refused."""
    rows = [_new_row(spec, source) for spec in specs]
    try:
        with transaction.atomic():  # a savepoint inside a caller's transaction
            if Worker.objects.filter(url__in=[row.url for row in rows]).exists():
                raise IntegrityError("a URL is stored already")
            Worker.objects.bulk_create(rows)
    except IntegrityError:
        return [_create_or_error(spec, source) for spec in specs]
    return [_queued_or_error(row, source) for row in rows]


def _queued_or_error(row: Worker, source: str) -> Worker | WorkerError:
    """Queue a reserved row's registration; a job that cannot be queued releases its row (as
    create_worker's transaction would), so the URL can be registered again."""
    try:
        _queue("register", row, local=source == WorkerSource.CLI)
    except JobQueueUnavailable as exc:
        Worker.objects.filter(pk=row.pk, job_generation=row.job_generation, registered=False).delete()
        return exc
    return row


def _create_or_error(spec: WorkerSpec, source: str) -> Worker | WorkerError:
    try:
        return create_worker(spec, source=source)
    except WorkerError as exc:
        return exc


def _create_together(specs: list[WorkerSpec], source: str) -> list[Worker]:
    """Reserve rows for these URLs (none stored when read) in one write and queue their
    registrations; a URL stored meanwhile (another gateway host) undoes that write and they are
    created one by one, as create_worker does (which refuses the one stored)."""
    rows = [_new_row(spec, source) for spec in specs]
    try:
        with transaction.atomic():  # a savepoint: an IntegrityError undoes this write alone
            Worker.objects.bulk_create(rows)
    except IntegrityError:
        return [create_worker(spec, source=source) for spec in specs]
    for row in rows:
        _queue("register", row, local=source == WorkerSource.CLI)
    return rows


def resilience_of(worker: Worker, config: GatewayConfig) -> Resilience:
    """The worker's resilience block with the gateway's --cb-* defaults filled in."""
    block: dict[str, Any] = worker.setting("resilience", {})
    defaults = Resilience.from_config(config)
    return Resilience(
        failure_threshold=max(1, int(block.get("cb_failure_threshold", defaults.failure_threshold))),
        success_threshold=max(1, int(block.get("cb_success_threshold", defaults.success_threshold))),
        timeout_secs=float(block.get("cb_timeout_secs", defaults.timeout_secs)),
        enabled=defaults.enabled,
        retryable_statuses=frozenset(block.get("retryable_status_codes", DEFAULT_RETRYABLE)),
        capacity_statuses=frozenset(block.get("capacity_status_codes", DEFAULT_CAPACITY)),
    )


def worker_records(config: GatewayConfig, workers: Iterable[Worker] | None = None) -> list[WorkerRecord]:
    """The registry's view of every registered worker (``workers``: rows already read, else one
    read). Command-line workers present the gateway's --api-key to the worker; API-registered
    workers present only their own key, and external providers only theirs, whatever registered them."""
    records = []
    pool_defaults = http_pool_defaults(config)
    for worker in Worker.objects.listed() if workers is None else workers:
        kind = kind_of(worker.url, worker.runtime_type)
        external = kind is WorkerKind.PROVIDER
        key = worker.api_key or (config.api_key if worker.source == WorkerSource.CLI and not external else None)
        records.append(
            WorkerRecord(
                id=str(worker.pk),
                url=worker.url,
                model_id=worker.model_id or None,
                runtime_type=worker.runtime_type,
                status=WorkerStatus(worker.status),
                api_key=key or None,
                resilience=resilience_of(worker, config),
                worker_type=WorkerType(worker.worker_type),
                order=(worker.created_at.timestamp(), worker.url),
                models=tuple(str(model) for model in worker.provider_models) if external else (),
                named_provider=(str(worker.labels.get("provider") or "") or None) if external else None,
                engine=(
                    engine_spec(worker.model_id, worker.model_cards, worker.labels, config, worker.settings)
                    if kind is WorkerKind.ENGINE
                    else None
                ),
                pd=pd_traits(worker),
                dp_ranks=dp_ranks(worker.url, kind, worker.labels, config),
                http_pool=(
                    HttpPool.of(worker.setting("http_pool") or {}, pool_defaults)
                    if kind is not WorkerKind.ENGINE
                    else None
                ),
                http2=http2_chosen(worker, kind),
            )
        )
    return records


def http_pool_defaults(config: GatewayConfig) -> HttpPool:
    """What an http_pool block's omitted fields take (spec 3): 500 idle connections, the idle time of
    --upstream-pool-idle-timeout-secs (0: forever), --request-timeout-secs, a 10 s connect."""
    idle = config.upstream_pool_idle_timeout_secs
    return HttpPool(timeout_secs=config.request_timeout_secs, idle_secs=idle if idle > 0 else float("inf"))



def pd_traits(worker: Worker) -> PdTraits | None:
    """What PD routing needs of a prefill, decode or encode worker (None for the others): its spec
    fields, a label where the field is empty (spec 3), and the pairing_protocol label. An encode
    worker's bootstrap_port is where prefill engines receive its embeddings (gRPC EPD)."""
    if worker.worker_type not in (WorkerType.PREFILL, WorkerType.DECODE, WorkerType.ENCODE):
        return None
    labels = worker.labels

    def text(name: str) -> str | None:
        value = worker.setting(name) or labels.get(name)
        return str(value) if value else None

    port = worker.setting("bootstrap_port")
    dp_size = worker.setting("dp_size")
    return PdTraits(
        bootstrap_port=int(port) if port else None,
        pairing_protocol=str(labels["pairing_protocol"]) if labels.get("pairing_protocol") else None,
        kv_connector=text("kv_connector"),
        kv_engine_id=text("kv_engine_id"),
        dp_size=int(dp_size) if dp_size else None,
    )
