"""/workers (spec 3, Workers): DRF adapters over administration/workers.py.

Bodies are parsed here, not by DRF's parsers, so a body that does not parse gets the spec's
plain-text answers: 415 without Content-Type application/json, 400 for malformed JSON, 422 for a
missing url, a wrong type or an unknown enum value. Other errors use ``{"error": msg, "code": CODE}``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import orjson
from django.http import HttpResponse
from rest_framework.request import Request
from rest_framework.response import Response

from administration.api.errors import worker_error_body
from administration.api.methods import ControlPlaneView
from common.db import on_store_thread
from administration.lifecycle import LIFECYCLE
from administration.models import Worker, WorkerType
from administration.worker_spec import SpecRuleError, SpecTypeError, parse_worker_patch, parse_worker_spec
from administration.workers import (
    WorkerError,
    create_worker,
    get_worker,
    JobStatus,
    job_of,
    list_workers,
    registering_workers,
    remove_worker,
    replace_worker,
    update_worker,
    worker_fields,
)
from common.config import current_config
from inference.routing.registry import REGISTRY

__all__ = ["WorkersView", "WorkerView", "worker_object"]

_DESERIALIZE = "Failed to deserialize the JSON body into the target type"


class BodyError(Exception):
    def __init__(self, status: int, text: str) -> None:
        self.status = status
        self.text = text


def _plain(status: int, text: str) -> HttpResponse:
    return HttpResponse(text, status=status, content_type="text/plain; charset=utf-8")


def _error(status: int, code: str, message: str) -> Response:
    return Response(worker_error_body(message, code), status=status)


def _json_body(request: Request) -> Any:
    content_type = (request.content_type or "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise BodyError(415, "Expected request with `Content-Type: application/json`")
    try:
        return orjson.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(400, f"Failed to parse the request body as JSON: {exc}") from None


def _worker_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise SpecRuleError(f"Invalid worker_id: {raw} is not a UUID") from None


def worker_object(worker: Worker) -> dict[str, Any]:
    """The worker as GET answers it, read from the store."""
    return _answer(str(worker.pk), worker_fields(worker, current_config()), job_of(worker))


def _answer(worker_id: str, fields: dict[str, Any], job: JobStatus | None) -> dict[str, Any]:
    """A worker's fields plus live state: load, engine load (looked up by id, so a list of N
    workers stays O(N)) and job status."""
    body = dict(fields)
    live = REGISTRY.load_of(worker_id)
    body["load"] = live.in_flight if live is not None else 0
    if live is not None and live.engine_load is not None:
        body["engine_load"] = list(live.engine_load)
    status = job.current() if job is not None else None
    if status is not None:
        body["job_status"] = status
    return body


def _listed(model: str | None) -> list[dict[str, Any]]:
    """GET /workers' list: from the fleet loop's copy of the store when it has applied every change
    the store has recorded (one indexed read tells), else from the store."""
    fleet = LIFECYCLE.fleet
    listing = fleet.current_listing() if fleet is not None else None
    if listing is None:
        return [worker_object(worker) for worker in list_workers(model)]
    return [
        _answer(state.record.id, state.fields, state.job)
        for state in listing
        if not model or not state.model_ids or model in state.model_ids
    ]


class _ControlPlaneView(ControlPlaneView):
    def handle_exception(self, exc: Exception) -> Response | HttpResponse:  # type: ignore[override]  # plain-text answers
        if isinstance(exc, BodyError):
            return _plain(exc.status, exc.text)
        if isinstance(exc, SpecTypeError):
            return _plain(422, f"{_DESERIALIZE}: {exc}")
        if isinstance(exc, SpecRuleError):
            return _error(400, "BAD_REQUEST", str(exc))
        if isinstance(exc, WorkerError):
            return _error(exc.status, exc.code, str(exc))
        return super().handle_exception(exc)


class WorkersView(_ControlPlaneView):
    def get(self, request: Request) -> HttpResponse:
        model = request.query_params.get("model") or None
        workers = _listed(model)
        types = Counter(worker["worker_type"] for worker in workers)
        stats = {
            "prefill_count": types[WorkerType.PREFILL],
            "decode_count": types[WorkerType.DECODE],
            "regular_count": types[WorkerType.REGULAR],
        }
        # The spec's list, total and stats leave out workers whose first registration runs; they are
        # shown beside it (status pending, job_status AddWorker), as GET /workers/{id} shows them.
        registering = [worker_object(worker) for worker in registering_workers(model)]
        body = {"workers": workers, "total": len(workers), "stats": stats, "registering": registering}
        return HttpResponse(orjson.dumps(body), content_type="application/json")

    def post(self, request: Request) -> Response:
        spec = parse_worker_spec(_json_body(request))
        worker = on_store_thread(create_worker, spec)
        location = f"/workers/{worker.pk}"
        body = {
            "status": "accepted",
            "worker_id": str(worker.pk),
            "url": worker.url,
            "location": location,
            "message": "Worker registration queued; poll the location for its status",
        }
        return Response(body, status=202, headers={"Location": location})


class WorkerView(_ControlPlaneView):
    def get(self, request: Request, worker_id: str) -> Response:
        return Response(worker_object(get_worker(_worker_id(worker_id))))

    def patch(self, request: Request, worker_id: str) -> Response:
        changes = parse_worker_patch(_json_body(request))
        key = _worker_id(worker_id)
        worker = update_worker(key, changes)
        return _accepted(worker, "Worker update queued")

    def put(self, request: Request, worker_id: str) -> Response:
        spec = parse_worker_spec(_json_body(request))
        key = _worker_id(worker_id)
        worker = replace_worker(key, spec)
        return _accepted(worker, "Worker replacement queued; registration runs again")

    def delete(self, request: Request, worker_id: str) -> Response:
        worker = remove_worker(_worker_id(worker_id))
        return _accepted(worker, "Worker removal queued; a ready worker drains first")


def _accepted(worker: Worker, message: str) -> Response:
    return Response({"status": "accepted", "worker_id": str(worker.pk), "message": message}, status=202)
