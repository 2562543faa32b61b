"""Worker registry domain functions (sync, ORM). The admin API, jobs and commands call these."""

from __future__ import annotations

import uuid
from typing import Sequence

from django.db import transaction

from administration.discovery import Discovery
from administration.models import Worker, WorkerSource, WorkerStatus
from inference.routing.registry import WorkerRecord

__all__ = ["sync_cli_workers", "worker_records", "record_discovery", "record_discovery_failure"]


def sync_cli_workers(urls: Sequence[str]) -> list[Worker]:
    """Make the stored command-line workers match ``--worker-urls``; they are re-discovered each start.

    Workers registered through the admin API are left alone, even when a flag names the same URL.
    """
    with transaction.atomic():
        Worker.objects.from_cli().exclude(url__in=list(urls)).delete()
        workers = []
        for url in urls:
            worker, created = Worker.objects.get_or_create(
                url=url, defaults={"source": WorkerSource.CLI, "status": WorkerStatus.PENDING}
            )
            if not created and worker.source == WorkerSource.CLI:
                Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.PENDING, last_error="")
                worker.status = WorkerStatus.PENDING
            workers.append(worker)
        return workers


def worker_records(gateway_api_key: str | None) -> list[WorkerRecord]:
    """The registry's view of every stored worker. Command-line workers present the gateway's
    --api-key to the worker; API-registered workers present only their own key."""
    records = []
    for worker in Worker.objects.all():
        key = worker.api_key or (gateway_api_key if worker.source == WorkerSource.CLI else None)
        records.append(
            WorkerRecord(
                id=str(worker.id),
                url=worker.url,
                model_id=worker.model_id or None,
                runtime_type=worker.runtime_type,
                status=worker.status,
                api_key=key or None,
            )
        )
    return records


def record_discovery(worker_id: uuid.UUID | str, discovery: Discovery) -> bool:
    """Store what discovery found and make the worker ready. False if the worker is gone."""
    updated = Worker.objects.filter(pk=worker_id, status=WorkerStatus.PENDING).update(
        runtime_type=discovery.runtime_type,
        model_id=discovery.model_id or "",
        status=WorkerStatus.READY,
        last_error="",
    )
    return updated == 1


def record_discovery_failure(worker_id: uuid.UUID | str, message: str) -> None:
    Worker.objects.filter(pk=worker_id).update(status=WorkerStatus.FAILED, last_error=message[:2000])
