"""A recovered gRPC prefill or decode worker's KV engine id, asked of its engine again (spec 3: "not_ready
| probes succeed | ready | gRPC prefill and decode re-read kv_engine_id").

An engine restarted behind the same address may come back with a new engine id (vLLM's
``kv_transfer_config.engine_id`` is per process unless pinned), and a Mooncake decode addresses the
prefill's KV by it. So when the health checker moves such a worker from not_ready (or failed) to
ready, the control plane asks the engine's GetServerInfo through the worker's shared engine client
and stores the ``kv_engine_id`` it reports as the worker's label, replacing what was stored (the
engine's value wins, D63). The spec field ``kv_engine_id``, when the operator set one, is left alone
and keeps overriding the label. Off the request path; a failed call is logged and changes nothing
(the worker stays ready).
"""

from __future__ import annotations

import asyncio
import logging

from django.db import transaction

from common.db import STORE_ERRORS, arun_db
from administration.engine_facts import kv_labels_from_server_info
from administration.models import Worker
from administration.notices import record_change
from inference.dataplane import data_plane
from inference.routing.workers import Transport, WorkerRecord, WorkerStatus, WorkerType
from inference.upstreams.failures import UpstreamFailure

__all__ = ["KV_ENGINE_ID", "rereads_kv_engine_id", "reread_kv_engine_id", "store_kv_engine_id"]

log = logging.getLogger(__name__)

KV_ENGINE_ID = "kv_engine_id"

_PD_TYPES = frozenset({WorkerType.PREFILL, WorkerType.DECODE})
_RECOVERED_FROM = frozenset({WorkerStatus.NOT_READY, WorkerStatus.FAILED})


def rereads_kv_engine_id(record: WorkerRecord, worker_type: str, old: str, new: str) -> bool:
    """Whether this transition asks the engine again: a gRPC prefill or decode worker recovering."""
    return (
        record.transport is Transport.GRPC and worker_type in _PD_TYPES and old in _RECOVERED_FROM
        and new == WorkerStatus.READY
    )  # fmt: skip


def store_kv_engine_id(worker_id: str, engine_id: str) -> bool:
    """Store the engine's id as the worker's ``kv_engine_id`` label; False when it was already that
    (or the worker is gone). A change is recorded, so every gateway process routes by it."""
    with transaction.atomic():
        worker = Worker.objects.select_for_update().filter(pk=worker_id, registered=True).first()
        if worker is None or worker.labels.get(KV_ENGINE_ID) == engine_id:
            return False
        worker.labels = {**worker.labels, KV_ENGINE_ID: engine_id}
        worker.save(update_fields=["labels"])
    record_change(worker_id)
    return True


async def reread_kv_engine_id(worker_id: str, record: WorkerRecord, timeout_secs: float) -> str | None:
    """Ask the engine for its KV engine id and store it; the id stored, or None when nothing changed
    (the call failed, the engine reports none, or it reports the stored one). Never raises."""
    try:
        async with asyncio.timeout(timeout_secs):
            info = await data_plane().engines.client(record).server_info()
    except (UpstreamFailure, TimeoutError) as exc:
        log.warning("worker %s: kv_engine_id not re-read after recovery (GetServerInfo: %s)", record.url, exc or "timed out")
        return None
    engine_id = kv_labels_from_server_info(info).get(KV_ENGINE_ID)
    if engine_id is None:
        return None
    try:
        changed = await arun_db(store_kv_engine_id, worker_id, engine_id)
    except STORE_ERRORS as exc:
        log.warning("worker %s: kv_engine_id %r not stored (%s)", record.url, engine_id, exc)
        return None
    if not changed:
        return None
    log.info("worker %s: kv_engine_id re-read after recovery: %s", record.url, engine_id)
    return engine_id
